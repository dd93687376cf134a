package rendezvous_test

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth/authtest"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/transport"
)

// TestNoServerLinked checks that dialing etcd does not link the etcd
// server: package rendezvous depends on the client only, and the server
// lives in package embedetcd.
func TestNoServerLinked(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list the dependencies with")
	}
	out, err := exec.Command(gobin, "list", "-deps", "github.com/weightcast/weightcast/rendezvous").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed only %q", deps)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "go.etcd.io/etcd/server") || strings.HasSuffix(d, "/rendezvous/embedetcd") {
			t.Errorf("package rendezvous depends on %s: a program that only dials etcd would link the etcd server", d)
		}
	}
}

// TestDialEtcdUnreachable dials a stopped server and an address that
// accepts connections but never answers: both fail within the timeout with
// a rendezvous error that matches ErrTimeout and names the address.
func TestDialEtcdUnreachable(t *testing.T) {
	e := startEmbedded(t)
	gone := e.ClientURL()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	silent, err := net.Listen("tcp", "127.0.0.1:0") // never accepts: the kernel completes the connections, nobody speaks
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, addr := range []string{gone, silent.Addr().String()} {
		start := time.Now()
		_, err := rendezvous.DialEtcd(context.Background(), []string{addr}, 500*time.Millisecond)
		took := time.Since(start)
		var re *rendezvous.Error
		switch {
		case !errors.As(err, &re):
			t.Fatalf("dial of %s = %v (%T); want a *rendezvous.Error", addr, err, err)
		case !errors.Is(err, rendezvous.ErrTimeout) || !errors.Is(err, transport.ErrTimeout):
			t.Errorf("dial of %s = %v; want it to match rendezvous.ErrTimeout and transport.ErrTimeout", addr, err)
		case !strings.Contains(err.Error(), "does not answer within 500ms") || !strings.Contains(err.Error(), addr):
			t.Errorf("dial of %s = %q; want it to name the address and the timeout", addr, err)
		case strings.Contains(err.Error(), `group ""`):
			t.Errorf("dial error %q names an empty group", err)
		}
		if took > 3*time.Second {
			t.Errorf("dial of %s with a 500ms timeout took %v", addr, took)
		}
	}
	// The caller's context bounds it too, and is reported as such.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = rendezvous.DialEtcd(ctx, []string{silent.Addr().String()}, time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rendezvous.ErrTimeout) {
		t.Errorf("dial bounded by its context = %v; want the context's deadline, not the dial timeout", err)
	}
	if _, err := rendezvous.DialEtcd(context.Background(), nil, 0); !errors.Is(err, rendezvous.ErrInvalid) {
		t.Fatalf("dial with no endpoints = %v; want ErrInvalid", err)
	}
}

// TestDialEtcdNotices dials an etcd that never answers: DialEtcd says
// every NoticeEvery that it still waits, and how long is left, through
// WithLogger, then times out.
func TestDialEtcdNotices(t *testing.T) {
	t.Parallel()
	silent, err := net.Listen("tcp", "127.0.0.1:0") // never accepts
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	var logs authtest.LogBuffer
	_, err = rendezvous.DialEtcd(context.Background(), []string{silent.Addr().String()}, rendezvous.NoticeEvery+time.Second, rendezvous.WithLogger(logs.Logger()))
	if !errors.Is(err, rendezvous.ErrTimeout) {
		t.Fatalf("dial of a silent etcd: %v; want ErrTimeout", err)
	}
	if got := logs.String(); !strings.Contains(got, "waiting for etcd at "+silent.Addr().String()+" to answer") || !strings.Contains(got, "s left") {
		t.Fatalf("DialEtcd said %q while it waited; want the address and the time left", got)
	}
}
