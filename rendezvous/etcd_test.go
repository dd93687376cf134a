package rendezvous_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/rendezvous"
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
func TestDialEtcdUnreachable(t *testing.T) {
	e := startEmbedded(t)
	gone := e.ClientURL()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := rendezvous.DialEtcd(context.Background(), []string{gone}, rendezvous.WithDialTimeout(500*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "does not answer") || !strings.Contains(err.Error(), gone) {
		t.Fatalf("dial of a stopped server = %v; want an error naming it", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("dial with a 500ms timeout took %v", d)
	}
	if _, err := rendezvous.DialEtcd(context.Background(), nil); err == nil {
		t.Fatal("dial with no endpoints succeeded")
	}
}
