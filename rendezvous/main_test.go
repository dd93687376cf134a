package rendezvous_test

import (
	"context"
	"flag"
	"runtime"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
)

// TestMain runs the package's parallel tests eight at a time unless
// -test.parallel says otherwise: they mostly wait (leases expiring,
// timeouts running out, a root that joins late), about 6 s of CPU in 70 s
// of wall time when run as many at once as there are CPUs (go test's
// default).
func TestMain(m *testing.M) {
	if f := flag.Lookup("test.parallel"); f != nil && f.Value.String() == strconv.Itoa(runtime.GOMAXPROCS(0)) {
		if err := flag.Set("test.parallel", "8"); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m)
}

// startEmbedded starts an embedded etcd for one test and stops it at the
// test's end.
func startEmbedded(t testing.TB) *embedetcd.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, err := embedetcd.Start(ctx, embedetcd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("closing embedded etcd: %v", err)
		}
	})
	return e
}

// dial connects a new store (a new client with its own lease) to endpoints.
func dial(t testing.TB, endpoints []string, ttl time.Duration) *rendezvous.Etcd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := rendezvous.DialEtcd(ctx, endpoints, 0, rendezvous.WithLeaseTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
