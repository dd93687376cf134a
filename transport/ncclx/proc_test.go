package ncclx

// Helpers for tests that run ranks as child processes: the test binary
// runs itself again with childEnv set, and TestMain hands such a process to
// runChild instead of the tests.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/nccl"
)

const childEnv = "WEIGHTCAST_NCCLX_TEST_CHILD"

// fileExchange is a transport.Exchange through files in a directory that
// every process of a test shares.
type fileExchange struct {
	dir  string
	rank int
}

func (x fileExchange) path(rank int, key string) string {
	return filepath.Join(x.dir, fmt.Sprintf("%d_%s", rank, url.PathEscape(key)))
}

func (x fileExchange) Put(ctx context.Context, key string, value []byte) error {
	p := x.path(x.rank, key)
	if _, err := os.Stat(p); err == nil {
		return fmt.Errorf("exchange: rank %d published %q twice", x.rank, key)
	}
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, value, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func (x fileExchange) Get(ctx context.Context, rank int, key string) ([]byte, error) {
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

// barrier returns once every rank of world has reached it.
func (x fileExchange) barrier(ctx context.Context, name string, world int) error {
	if err := x.Put(ctx, "barrier."+name, nil); err != nil {
		return err
	}
	for r := range world {
		if _, err := x.Get(ctx, r, "barrier."+name); err != nil {
			return err
		}
	}
	return nil
}

// child is a rank running in another process.
type child struct {
	rank int
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error
}

func (c *child) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.String()
}

// startChild runs this test binary as rank cfg's child. The test's cleanup
// kills it if it is still running and waits for it.
func startChild(t *testing.T, rank int, cfg any) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(cfg)
	c := &child{rank: rank, done: make(chan error, 1)}
	c.cmd = exec.Command(exe, "-test.run=^$")
	c.cmd.Env = append(nccl.SafeEnv(os.Environ()), childEnv+"="+string(js))
	c.cmd.Stdout, c.cmd.Stderr = c, c
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- c.cmd.Wait() }()
	t.Cleanup(func() {
		c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.done
		c.done <- nil
		if t.Failed() {
			t.Logf("rank %d output:\n%s", rank, c.output())
		}
	})
	return c
}

// wait waits for the child to exit and fails the test if it did not exit
// cleanly within d.
func (c *child) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		if err != nil {
			t.Errorf("rank %d: %v\n%s", c.rank, err, c.output())
		}
	case <-time.After(d):
		t.Errorf("rank %d still running after %v\n%s", c.rank, d, c.output())
	}
}

// kill ends the child with SIGKILL and waits until it is gone.
func (c *child) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	err := <-c.done
	c.done <- err
}
