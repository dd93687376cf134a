package zmqbus

import "github.com/weightcast/weightcast/transport"

// Bus is how the ZeroMQ metadata bus describes itself to the registry
// (as Name): the bus of ranks in separate processes, on one host or many.
var Bus = transport.Bus{Name: Name, OpenPublisher: OpenPublisher, OpenSubscriber: OpenSubscriber}

func init() { transport.RegisterBus(Bus) }
