package rendezvous_test

import (
	"context"
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

// TestWaitChangeRewritten rewrites a key behind the stores' backs, as a
// client that is not a rendezvous Store can: WaitChange reports Rewritten
// with the new value, on etcd and on Mem.
func TestWaitChangeRewritten(t *testing.T) {
	e := startEmbedded(t)
	m := rendezvoustest.NewMem()
	etcd := dial(t, []string{e.ClientURL()}, 5*time.Second)
	mem := m.NewStore()
	defer mem.Close()
	for name, c := range map[string]struct {
		s       rendezvous.Store
		rewrite func(key, value string) error
	}{
		"etcd": {etcd, func(k, v string) error { return rendezvous.Put(context.Background(), etcd, k, v) }},
		"mem":  {mem, func(k, v string) error { m.Put(k, []byte(v)); return nil }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		key := "/rewritten/" + name
		if _, _, err := c.s.CreateLeased(ctx, key, []byte("v1")); err != nil {
			t.Fatal(err)
		}
		type result struct {
			c   rendezvous.Change
			v   []byte
			err error
		}
		res := make(chan result, 1)
		go func() {
			ch, v, err := c.s.WaitChange(ctx, key, []byte("v1"))
			res <- result{ch, v, err}
		}()
		time.Sleep(100 * time.Millisecond)
		if err := c.rewrite(key, "v2"); err != nil {
			t.Fatal(err)
		}
		r := <-res
		if r.err != nil || r.c != rendezvous.Rewritten || string(r.v) != "v2" {
			t.Errorf("%s: a rewritten key: %v %q, %v; want Rewritten \"v2\"", name, r.c, r.v, r.err)
		}
	}
}
