package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/rendezvous/embedetcd"
)

// Chaos tests: ranks (and the rendezvous server) stopped or killed in the
// middle of the rounds. Every other rank must end within 30 s with an
// error naming what went wrong.

// TestSIGSTOP freezes one rank with SIGSTOP (a hung process, a debugger, a
// swapped-out host): it neither acknowledges nor heartbeats nor closes its
// connections. Every other rank fails within 30 s naming it.
func TestSIGSTOP(t *testing.T) { signalRank(t, "stop", syscall.SIGSTOP, "SIGSTOP") }

// TestEtcdKilled kills the rendezvous server (an etcd in a process of its
// own) with SIGKILL in the middle of the rounds. The ranks cannot tell a
// lost peer from a lost server any more, so every rank should end within
// 30 s with an error that names the rendezvous: each rank's Group breaks
// when its own lease can no longer be renewed (about the lease TTL).
func TestEtcdKilled(t *testing.T) {
	etcd, server := startEtcdProcess(t)
	ps := startAll(t, etcd, "etcd-kill", "r1", 4, "--size", "64MiB", "--tensors", "30", "--bucket", "4MiB", "--rounds", "1000", "--timeout", "60s")
	time.Sleep(3 * time.Second)
	for _, p := range ps {
		select {
		case <-p.done:
			t.Fatalf("rank %d ended before the kill: %v\n%s", p.rank, p.exit, p.err.String())
		default:
		}
	}
	killed := time.Now()
	if err := server.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if err := p.wait(t, 30*time.Second); err == nil {
			t.Fatalf("rank %d exited 0 after the rendezvous server was killed", p.rank)
		}
		msg := p.err.String() + p.out.String()
		if !strings.Contains(msg, "rendezvous") && !strings.Contains(msg, "etcd") {
			t.Errorf("rank %d's error does not name the rendezvous:\n%s", p.rank, msg)
		}
		t.Logf("rank %d exited %.1fs after the kill: %s", p.rank, p.exited.Sub(killed).Seconds(), p.summary(t).PerRank[0].Error)
	}
}

// serveEtcdEnv, set in a child of the test binary, makes it serve an
// embedded etcd and print its client URL instead of running tests.
const serveEtcdEnv = "WEIGHTCAST_TEST_SERVE_ETCD"

// serveEtcd runs in that child: it serves until killed or its parent
// closes its standard input.
func serveEtcd() int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	emb, err := embedetcd.Start(ctx, embedetcd.Options{})
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer emb.Close()
	fmt.Println(emb.ClientURL())
	stop, cancelStop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancelStop()
	go func() { bufio.NewReader(os.Stdin).ReadByte(); cancelStop() }()
	<-stop.Done()
	return 0
}

// startEtcdProcess starts an etcd server in a process of its own (this
// test binary, serving an embedded etcd) and returns its etcd:// address
// and the process.
func startEtcdProcess(t *testing.T) (string, *os.Process) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), serveEtcdEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			urls <- sc.Text()
		}
		close(urls)
		for sc.Scan() {
		}
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		<-done
	})
	select {
	case url, ok := <-urls:
		if !ok {
			t.Fatal("the etcd process exited before serving")
		}
		return "etcd://" + strings.TrimPrefix(url, "http://"), cmd.Process
	case <-time.After(30 * time.Second):
		t.Fatal("the etcd process did not serve within 30s")
		return "", nil
	}
}
