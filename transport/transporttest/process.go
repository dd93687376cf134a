package transporttest

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

// Child is a rank running in another process: the test binary run again
// with an environment variable that its TestMain hands to the child's code.
type Child struct {
	rank int
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error
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
func StartChild(t *testing.T, env string, extra []string, rank int, cfg any) *Child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(cfg)
	c := &Child{rank: rank, done: make(chan error, 1)}
	c.cmd = exec.Command(exe, "-test.run=^$")
	c.cmd.Env = append(append(os.Environ(), extra...), env+"="+string(js), "NCCL_NVLS_ENABLE=0")
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
			t.Logf("rank %d output:\n%s", rank, c.Output())
		}
	})
	return c
}

// Wait waits for the child to exit and fails the test if it did not exit
// cleanly within d.
func (c *Child) Wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		if err != nil {
			t.Errorf("rank %d: %v\n%s", c.rank, err, c.Output())
		}
	case <-time.After(d):
		t.Errorf("rank %d still running after %v\n%s", c.rank, d, c.Output())
	}
}

// Kill ends the child with SIGKILL and waits until it is gone.
func (c *Child) Kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	err := <-c.done
	c.done <- err
}
