package transporttest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
)

// FileExchange is a transport.Exchange through files in a directory that
// every process of a test shares (child processes of a test binary, which
// have no rendezvous of their own). Rank is the rank that Puts.
type FileExchange struct {
	Dir  string
	Rank int
}

func (x FileExchange) path(rank int, key string) string {
	return filepath.Join(x.Dir, fmt.Sprintf("%d_%s", rank, url.PathEscape(key)))
}

// Put publishes value under key for x.Rank, once.
func (x FileExchange) Put(ctx context.Context, key string, value []byte) error {
	p := x.path(x.Rank, key)
	if _, err := os.Stat(p); err == nil {
		return fmt.Errorf("exchange: rank %d published %q twice", x.Rank, key)
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, value, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

// Get waits until rank has published key.
func (x FileExchange) Get(ctx context.Context, rank int, key string) ([]byte, error) {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		v, err := os.ReadFile(x.path(rank, key))
		if err == nil {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("exchange: waiting for rank %d's %q: %w", rank, key, ctx.Err())
		case <-t.C:
		}
	}
}

// Barrier returns once every rank of world has reached it.
func (x FileExchange) Barrier(ctx context.Context, name string, world int) error {
	return Barrier(ctx, x, name, world)
}

// Barrier publishes through x that this rank has reached the barrier called
// name, and returns once every rank of world has.
func Barrier(ctx context.Context, x transport.Exchange, name string, world int) error {
	key := "barrier." + name
	if err := x.Put(ctx, key, nil); err != nil {
		return err
	}
	for r := range world {
		if _, err := x.Get(ctx, r, key); err != nil {
			return fmt.Errorf("barrier %q: %w", name, err)
		}
	}
	return nil
}

// Group is what the processes of one multi-process test share: a group
// name of their own and the directory that their file exchange lives in.
// A child gets it in its configuration (it marshals as JSON).
type Group struct {
	Name string
	Dir  string
}

// NewGroup names a group prefix-<pid>, with a temporary directory removed
// when t ends.
func NewGroup(t testing.TB, prefix string) Group {
	return Group{Name: fmt.Sprintf("%s-%d", prefix, os.Getpid()), Dir: t.TempDir()}
}

// Exchange is rank's view of the group's file exchange.
func (g Group) Exchange(rank int) FileExchange {
	return FileExchange{Dir: g.Dir, Rank: rank}
}

// Config is rank's transport configuration in a world of world ranks, its
// buffers on d, each wait bounded by timeout.
func (g Group) Config(rank, world int, d mem.Device, timeout time.Duration) transport.Config {
	return transport.Config{Group: g.Name, Rank: rank, WorldSize: world, Device: d, Exchange: g.Exchange(rank), Timeout: timeout}
}

// Role is a kind of child process that a package's tests start (a Procs, a
// Suite): the test binary run again with the role's environment variable
// set. Main hands such a process to its role.
type Role interface {
	// PlayChild plays this process's rank and returns its exit status
	// when this process is one of the role's children; ok is false when
	// it is not.
	PlayChild() (code int, ok bool)
}

// Main is the TestMain of a package whose tests start child processes: in a
// child of one of roles it plays that child's rank and exits with its
// status; otherwise it runs the tests under goleak.
func Main(m *testing.M, roles ...Role) {
	for _, r := range roles {
		if code, ok := r.PlayChild(); ok {
			os.Exit(code)
		}
	}
	goleak.VerifyTestMain(m)
}

// Procs is the plumbing of tests whose ranks run as child processes: Start
// runs the test binary again with Env set to a rank's configuration, a C as
// JSON, and the package's TestMain (Main, given this Procs) hands such a
// process to Run instead of running the tests.
type Procs[C any] struct {
	// Env names the environment variable that carries a child's
	// configuration; one per role (WEIGHTCAST_<PKG>_TEST_CHILD).
	Env string
	// Run plays a child's rank with its configuration.
	Run func(cfg C) error
}

// PlayChild, in a child process started by p, decodes the configuration and
// runs Run: status 0 after printing "rank <r>: ok", 1 after printing
// "rank <r>: <error>" to stderr, 2 where the configuration does not decode.
func (p Procs[C]) PlayChild() (code int, ok bool) {
	js := os.Getenv(p.Env)
	if js == "" {
		return 0, false
	}
	return p.child(js, os.Getenv(p.Env+"_RANK")), true
}

func (p Procs[C]) child(js, rank string) int {
	var cfg C
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bad child config:", err)
		return 2
	}
	if err := p.Run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "rank %s: %v\n", rank, err)
		return 1
	}
	fmt.Printf("rank %s: ok\n", rank)
	return 0
}

// Start runs rank in a child process with cfg (NCCL_NVLS_ENABLE=0 set); the
// test's cleanup kills it if it still runs and waits for it.
func (p Procs[C]) Start(t testing.TB, rank int, cfg C) *Child {
	t.Helper()
	return StartChild(t, p.Env, []string{fmt.Sprintf("%s_RANK=%d", p.Env, rank)}, rank, cfg)
}

// Child is a rank running in another process: the test binary run again
// with an environment variable that its TestMain hands to the child's code.
type Child struct {
	rank int
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error // receives the exit once; whoever takes it puts it back
}

// Write collects the child's output.
func (c *Child) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

// Output is what the child printed so far.
func (c *Child) Output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// StartChild runs this test binary again as rank's child, with env set to
// cfg as JSON and the extra environment variables (NCCL_NVLS_ENABLE=0 is
// always set). The test's cleanup kills it if it is still running and waits
// for it.
func StartChild(t testing.TB, env string, extra []string, rank int, cfg any) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{rank: rank, done: make(chan error, 1)}
	c.cmd = exec.Command(exe, "-test.run=^$")
	c.cmd.Env = append(append(os.Environ(), extra...), env+"="+string(js), "NCCL_NVLS_ENABLE=0")
	c.cmd.Stdout, c.cmd.Stderr = c, c
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() {
		c.Kill()
		if t.Failed() {
			t.Logf("rank %d output:\n%s", rank, c.Output())
		}
	})
	return c
}

// Exit waits at most d for the child to exit and returns how it ended: nil
// for status 0, the *exec.ExitError otherwise, or an error saying that it
// still runs.
func (c *Child) Exit(d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-c.done:
		c.done <- err
		return err
	case <-t.C:
		return fmt.Errorf("rank %d still running after %v", c.rank, d)
	}
}

// Wait waits for the child to exit and fails the test if it did not exit
// cleanly within d.
func (c *Child) Wait(t testing.TB, d time.Duration) {
	t.Helper()
	if err := c.Exit(d); err != nil {
		t.Errorf("rank %d: %v\n%s", c.rank, err, c.Output())
	}
}

// Kill ends the child with SIGKILL and waits until it is gone.
func (c *Child) Kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	err := <-c.done
	c.done <- err
}

// killed reports whether err is the exit of a process ended by SIGKILL.
func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}
