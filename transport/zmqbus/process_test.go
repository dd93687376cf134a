package zmqbus

const childEnv = "WEIGHTCAST_ZMQBUS_TEST_CHILD"

func runChild(role string) int { return 2 }
