package rendezvoustest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/rendezvous"
)

// ExternalEtcd returns the client URLs of an etcd server separate from the
// test process: WEIGHTCAST_ETCD_ENDPOINTS (comma-separated) when set, else
// an etcd binary found on PATH (Debian: etcd-server), started on a
// temporary directory and stopped at the end of the test. It skips the test
// when neither is available.
func ExternalEtcd(t *testing.T) []string {
	t.Helper()
	if env := os.Getenv("WEIGHTCAST_ETCD_ENDPOINTS"); env != "" {
		return strings.Split(env, ",")
	}
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("no etcd binary on PATH (Debian: apt install etcd-server) and WEIGHTCAST_ETCD_ENDPOINTS unset; skipping the external etcd run")
	}
	// etcd 3.4 cannot listen on port 0 and report the port, so take two
	// ports the OS hands out and pass them on. Only this harness does
	// this; another process could take a port in between.
	clientPort, peerPort := freePort(t), freePort(t)
	client := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	dataDir := filepath.Join(t.TempDir(), "etcd")
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--name", "test",
		"--data-dir", dataDir,
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "test="+peer,
		"--logger", "zap", "--log-level", "error")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	// Wait until it answers.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := rendezvous.DialEtcd(ctx, []string{client}, time.Second)
		cancel()
		if err == nil {
			s.Close()
			return []string{client}
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd at %s did not answer within 20s: %v", client, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
