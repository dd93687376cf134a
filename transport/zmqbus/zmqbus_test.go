package zmqbus

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/transport/transporttest"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	goleak.VerifyTestMain(m)
}

var openers = transporttest.MetaOpeners{Publisher: OpenPublisher, Subscriber: OpenSubscriber}

func TestConformance(t *testing.T) { transporttest.TestMetaBus(t, t.Name(), openers) }
