package rendezvous_test

import (
	"testing"
	"time"

	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/rendezvoustest"
)

func TestStoreEmbeddedEtcd(t *testing.T) {
	e := startEmbedded(t)
	rendezvoustest.TestStore(t, func(t *testing.T) rendezvous.Store {
		return dial(t, []string{e.ClientURL()}, 5*time.Second)
	})
}

func TestStoreMem(t *testing.T) {
	m := rendezvoustest.NewMem()
	rendezvoustest.TestStore(t, func(t *testing.T) rendezvous.Store {
		s := m.NewStore()
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// TestStoreExternalEtcd runs the suite on a separate etcd server: the one
// at WEIGHTCAST_ETCD_ENDPOINTS (comma-separated) when set, else an etcd
// binary found on PATH, started here on a temporary directory.
func TestStoreExternalEtcd(t *testing.T) {
	endpoints := rendezvoustest.ExternalEtcd(t)
	rendezvoustest.TestStore(t, func(t *testing.T) rendezvous.Store {
		return dial(t, endpoints, 5*time.Second)
	})
}
