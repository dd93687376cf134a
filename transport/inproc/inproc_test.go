package inproc

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/transport/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) { transporttest.TestEndpoints(t, t.Name(), Open) }

func TestMetaConformance(t *testing.T) {
	transporttest.TestMetaBus(t, t.Name(), transporttest.MetaOpeners{Publisher: OpenPublisher, Subscriber: OpenSubscriber})
}
