package inproc

import (
	"testing"

	"github.com/weightcast/weightcast/transport/transporttest"
)

// conformance is the transport suite for inproc: host memory, every rank a
// goroutine of one process (the transport's one way).
var conformance = &transporttest.Suite{Name: Name, Open: Open, Memory: transporttest.HostMemory{}, Ranks: transporttest.Goroutines}

func TestMain(m *testing.M) { transporttest.Main(m, conformance) }

func TestConformance(t *testing.T) { conformance.Run(t) }

func TestMetaConformance(t *testing.T) {
	transporttest.TestMetaBus(t, t.Name(), transporttest.MetaOpeners{Publisher: OpenPublisher, Subscriber: OpenSubscriber})
}
