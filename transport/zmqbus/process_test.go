package zmqbus

// Tests with a real second process: the test binary runs itself again
// with childEnv set and plays one rank, which the test then kills with
// SIGKILL.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

const childEnv = "WEIGHTCAST_ZMQBUS_TEST_CHILD"

// Liveness settings of the process tests.
const (
	childHeartbeat = "100ms"
	childLiveness  = time.Second
)

func childOptions() map[string]string {
	return map[string]string{"heartbeat": childHeartbeat, "liveness": childLiveness.String()}
}

// lineExchange is the child's Exchange: Put prints "put KEY VALUE" on
// stdout for the parent, Get returns the address the parent passed in
// the environment.
type lineExchange struct{ addr string }

func (x lineExchange) Put(_ context.Context, key string, value []byte) error {
	_, err := fmt.Printf("put %s %s\n", key, value)
	return err
}

func (x lineExchange) Get(_ context.Context, rank int, key string) ([]byte, error) {
	if rank != 0 || key != AddrKey || x.addr == "" {
		return nil, fmt.Errorf("child exchange has no %q of rank %d", key, rank)
	}
	return []byte(x.addr), nil
}

// runChild plays one rank until it fails or is killed. Its stdout tells
// the parent how far it got.
func runChild(role string) int {
	rank, _ := strconv.Atoi(os.Getenv("CHILD_RANK"))
	world, _ := strconv.Atoi(os.Getenv("CHILD_WORLD"))
	cfg := transport.Config{
		Group: os.Getenv("CHILD_GROUP"), Rank: rank, WorldSize: world, Device: mem.Host{},
		Exchange: lineExchange{addr: os.Getenv("CHILD_ADDR")}, Timeout: time.Minute, Options: childOptions(),
	}
	ctx := context.Background()
	switch role {
	case "subscriber":
		s, err := OpenSubscriber(ctx, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("joined")
		for {
			m, err := s.Recv(ctx)
			if err == nil {
				err = s.Ack(ctx, m.Seq)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
	case "publisher":
		p, err := OpenPublisher(ctx, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		for k := 0; ; k++ {
			if err := p.Publish(ctx, uint64(k), payload(k)); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
	}
	fmt.Fprintln(os.Stderr, "unknown child role", role)
	return 2
}

// lineProc is a running process whose stdout lines arrive on lines: a
// child of this test binary or a Python peer.
type lineProc struct {
	name  string // "child", "python peer": for failure messages
	cmd   *exec.Cmd
	lines chan string   // stdout lines; closed by the scanning goroutine at EOF
	done  chan struct{} // closed by the scanning goroutine when stdout is drained
}

// startLines starts cmd and reads its stdout line by line. The test's
// cleanup kills the process if it still runs and reaps it.
func startLines(t *testing.T, name string, cmd *exec.Cmd) *lineProc {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &lineProc{name: name, cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
		cmd.Wait()
	})
	return p
}

// startChild runs this test binary again as rank of world playing role,
// with addr as the root's address.
func startChild(t *testing.T, role string, rank, world int, addr string) *lineProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		childEnv+"="+role,
		"CHILD_GROUP="+t.Name(),
		"CHILD_RANK="+strconv.Itoa(rank),
		"CHILD_WORLD="+strconv.Itoa(world),
		"CHILD_ADDR="+addr,
	)
	cmd.Stderr = os.Stderr
	return startLines(t, "child", cmd)
}

// line waits for the process's next stdout line.
func (p *lineProc) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("%s exited early", p.name)
		}
		return l
	case <-time.After(20 * time.Second):
		t.Fatalf("%s said nothing within 20s", p.name)
	}
	return ""
}

// wait waits for the process to exit and returns its exit code.
func (p *lineProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not exit within 20s", p.name)
	}
	p.cmd.Wait()
	return p.cmd.ProcessState.ExitCode()
}

// kill sends SIGKILL, reaps the process and returns when the signal was
// sent.
func (p *lineProc) kill(t *testing.T) time.Time {
	t.Helper()
	at := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	p.cmd.Wait()
	return at
}

// TestSubscriberKilled: a receiver process killed with SIGKILL in the
// middle of a stream makes the root's Publish fail with ErrPeerGone naming
// its rank within the liveness bound, and the other receivers hear why.
func TestSubscriberKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	ctx := testContext(t, time.Minute)
	const world, victim = 4, 3
	cfgs := configs(t, world, 30*time.Second, childOptions())
	pub := openPublisher(t, ctx, cfgs[0])
	c := startChild(t, "subscriber", victim, world, rootAddr(t, ctx, cfgs[1]))

	var subs []transport.Subscriber
	for r := 1; r < victim; r++ {
		subs = append(subs, openSubscriber(t, ctx, cfgs[r]))
	}
	if l := c.line(t); l != "joined" {
		t.Fatalf("child said %q", l)
	}
	subErrs := make([]error, len(subs))
	var wg sync.WaitGroup
	for i, s := range subs {
		wg.Go(func() {
			for {
				m, err := s.Recv(ctx)
				if err == nil {
					err = s.Ack(ctx, m.Seq)
				}
				if err != nil {
					subErrs[i] = err
					return
				}
			}
		})
	}
	var killed time.Time
	var perr error
	for k := 0; ; k++ {
		if k == 200 {
			killed = c.kill(t)
		}
		if perr = pub.Publish(ctx, uint64(k), payload(k)); perr != nil {
			if k < 200 {
				t.Fatalf("publish %d before the kill: %v", k, perr)
			}
			break
		}
	}
	took := time.Since(killed)
	te := wantBusError(t, perr, transport.ErrPeerGone, victim, fmt.Sprintf("rank %d", victim))
	if took > childLiveness+500*time.Millisecond {
		t.Errorf("the root noticed the kill after %v; liveness is %v", took, childLiveness)
	}
	t.Logf("the root noticed the SIGKILL after %v (liveness %v): %v", took.Round(time.Millisecond), childLiveness, te)
	wg.Wait()
	for _, err := range subErrs {
		wantBusError(t, err, transport.ErrPeerGone, 0, fmt.Sprintf("rank %d", victim))
	}
}

// TestPublisherKilled: a root process killed with SIGKILL makes every
// receiver's Recv fail with ErrPeerGone within the liveness bound.
func TestPublisherKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	ctx := testContext(t, time.Minute)
	const world = 3
	c := startChild(t, "publisher", 0, world, "")
	l := c.line(t)
	addr, ok := strings.CutPrefix(l, "put "+AddrKey+" ")
	if !ok {
		t.Fatalf("child said %q", l)
	}
	ex := transporttest.NewMemExchange()
	if err := ex.For(0).Put(ctx, AddrKey, []byte(addr)); err != nil {
		t.Fatal(err)
	}
	var subs []transport.Subscriber
	for r := 1; r < world; r++ {
		subs = append(subs, openSubscriber(t, ctx, transport.Config{Group: t.Name(), Rank: r, WorldSize: world, Device: mem.Host{},
			Exchange: ex.For(r), Timeout: 30 * time.Second, Options: childOptions()}))
	}
	var (
		wg       sync.WaitGroup
		errs     = make([]error, len(subs))
		failedAt = make([]time.Time, len(subs))
		counts   = make([]int, len(subs))
		reached  = make(chan struct{}, len(subs))
	)
	for i, s := range subs {
		wg.Go(func() {
			for k := 0; ; k++ {
				if k == 100 {
					reached <- struct{}{}
				}
				m, err := s.Recv(ctx)
				if err == nil && (m.Seq != uint64(k) || string(m.Data) != string(payload(k))) {
					err = fmt.Errorf("message %d came as seq %d", k, m.Seq)
				}
				if err == nil {
					err = s.Ack(ctx, m.Seq)
				}
				if err != nil {
					errs[i], counts[i], failedAt[i] = err, k, time.Now()
					return
				}
			}
		})
	}
	for range subs {
		<-reached
	}
	killed := c.kill(t)
	wg.Wait()
	for i, err := range errs {
		wantBusError(t, err, transport.ErrPeerGone, 0, "root")
		took := failedAt[i].Sub(killed)
		if took > childLiveness+500*time.Millisecond {
			t.Errorf("rank %d noticed the kill after %v; liveness is %v", i+1, took, childLiveness)
		}
		t.Logf("rank %d got %d messages in order, then noticed the SIGKILL after %v: %v", i+1, counts[i], took.Round(time.Millisecond), err)
	}
	if errors.Join(errs...) == nil {
		t.Fatal("no receiver failed")
	}
}
