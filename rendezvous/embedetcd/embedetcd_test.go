package embedetcd_test

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/auth/authtest"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startEmbedded starts a server for one test and stops it at the test's end.
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

// dial connects a client with its own lease to endpoints.
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

func TestTemporaryDir(t *testing.T) {
	e := startEmbedded(t)
	u, err := url.Parse(e.ClientURL())
	if err != nil || u.Scheme != "http" || u.Hostname() != "127.0.0.1" || u.Port() == "" || u.Port() == "0" {
		t.Fatalf("client URL %q: want http://127.0.0.1:<bound port>", e.ClientURL())
	}
	dir := e.DataDir()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("data dir while running: %v", err)
	}
	s := dial(t, []string{e.ClientURL()}, 2*time.Second)
	if _, _, err := s.Create(context.Background(), "/k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("temporary data dir %s still there after Close (%v)", dir, err)
	}
}

func TestGivenAddrAndDir(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "etcd")
	// A wildcard address: the client URL is the loopback one.
	e, err := embedetcd.Start(ctx, embedetcd.Options{Addr: "0.0.0.0:0", DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if !strings.HasPrefix(e.ClientURL(), "http://127.0.0.1:") {
		t.Fatalf("client URL of a wildcard listener = %q; want the loopback address", e.ClientURL())
	}
	// A second server on the same address is refused, naming it.
	u, _ := url.Parse(e.ClientURL())
	_, err = embedetcd.Start(ctx, embedetcd.Options{Addr: u.Host})
	if err == nil || !strings.Contains(err.Error(), u.Host) {
		t.Fatalf("second server on %s: %v; want an error naming the address", u.Host, err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "member")); err != nil {
		t.Fatalf("a given data dir must be kept after Close: %v", err)
	}
	if _, err := embedetcd.Start(ctx, embedetcd.Options{Addr: "nonsense"}); err == nil {
		t.Fatal("an address without a port was accepted")
	}
}

// TestTLS serves clients over TLS with client certificates: a client with
// a certificate of the same authority reads and writes; one without TLS,
// or with another authority's certificate, gets nothing.
func TestTLS(t *testing.T) {
	ca := authtest.NewCA(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := embedetcd.Start(ctx, embedetcd.Options{TLS: ca.Issue(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if !strings.HasPrefix(e.ClientURL(), "https://127.0.0.1:") {
		t.Fatalf("client URL %q; want https://", e.ClientURL())
	}
	s, err := rendezvous.DialEtcd(ctx, []string{e.ClientURL()}, 5*time.Second, rendezvous.WithTLS(ca.TLS(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, err := s.Create(ctx, "/tls", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, ok, err := s.Get(ctx, "/tls"); err != nil || !ok || string(v) != "v" {
		t.Fatalf("get over TLS: %q %v %v", v, ok, err)
	}
	hostPort := strings.TrimPrefix(e.ClientURL(), "https://")
	if _, err := rendezvous.DialEtcd(ctx, []string{e.ClientURL()}, time.Second); !errors.Is(err, rendezvous.ErrInvalid) || !strings.Contains(err.Error(), "needs TLS settings") {
		t.Errorf("an https endpoint without TLS settings: %v", err)
	}
	if _, err := rendezvous.DialEtcd(ctx, []string{hostPort}, time.Second); !errors.Is(err, rendezvous.ErrTimeout) || !strings.Contains(err.Error(), "if etcd serves TLS") {
		t.Errorf("a plain client of a TLS server: %v; want a timeout hinting at TLS", err)
	}
	if _, err := rendezvous.DialEtcd(ctx, []string{hostPort}, time.Second, rendezvous.WithTLS(authtest.NewCA(t).TLS(t))); !errors.Is(err, rendezvous.ErrTimeout) {
		t.Errorf("a client of another authority: %v; want it refused", err)
	}
	if _, err := rendezvous.DialEtcd(ctx, []string{"http://" + hostPort}, time.Second, rendezvous.WithTLS(ca.TLS(t))); !errors.Is(err, rendezvous.ErrInvalid) {
		t.Errorf("an http endpoint with TLS settings: %v; want ErrInvalid", err)
	}
	if _, err := embedetcd.Start(ctx, embedetcd.Options{TLS: auth.TLSFiles{CA: "/nonexistent", Cert: "/x", Key: "/y"}}); err == nil || !strings.Contains(err.Error(), "/nonexistent") {
		t.Errorf("start with missing TLS files: %v", err)
	}
}
