package nccl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
)

// The tests below need a GPU and NCCL; they skip, saying why, elsewhere.

func testDevice(t *testing.T) *gpu.CUDADevice {
	t.Helper()
	gputest.SkipWithoutCUDA(t, "a CUDA GPU")
	if err := Load(Options{}); errors.Is(err, ErrNoLibrary) {
		t.Skipf("skipping: needs NCCL: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	return gputest.Open(t, 0)
}

func TestVersion(t *testing.T) {
	testDevice(t)
	v, err := Version()
	if err != nil {
		t.Fatal(err)
	}
	if v < 22800 {
		t.Errorf("NCCL %s is older than the 2.28 config layout this package uses", v)
	}
	t.Logf("NCCL %s from %s", v, LoadedPath())
	if os.Getenv("NCCL_NVLS_ENABLE") != "0" {
		t.Error("NCCL_NVLS_ENABLE is not 0 after Load")
	}
	if err := Load(Options{Library: LoadedPath()}); err != nil {
		t.Errorf("Load of the library already loaded: %v", err)
	}
	other := otherLibraryPath(t)
	if err := Load(Options{Library: other}); err == nil || !strings.Contains(err.Error(), "already loaded") {
		t.Errorf("Load of a second library %s: %v, want an 'already loaded' error", other, err)
	}
}

// otherLibraryPath names a file other than the loaded library.
func otherLibraryPath(t *testing.T) string { return t.TempDir() + "/libnccl.so.2" }

func TestBroadcastSingleRank(t *testing.T) {
	d := testDevice(t)
	s := gputest.Stream(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, err := NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c, err := NewComm(ctx, Config{Device: d, ID: id, NRanks: 1, Rank: 0, Label: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("non-blocking init of a 1-rank communicator took %v", time.Since(start).Round(time.Millisecond))

	const n = 64<<20 + 7
	src := make([]byte, n)
	for i := range src {
		src[i] = byte(i*131 + i>>11)
	}
	send, recv := gputest.Alloc(t, d, n), gputest.Alloc(t, d, n)
	gputest.Upload(t, s, send, 0, src)
	if err := s.Memset(recv, 0, n, 0); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := c.Broadcast(ctx, send.DevicePtr(), recv.DevicePtr(), n, 0, s); err != nil {
		t.Fatal(err)
	}
	t.Logf("broadcast of %d bytes took %v", n, time.Since(start))
	if got := gputest.Download(t, s, recv, 0, n); !bytes.Equal(got, src) {
		t.Fatal("broadcast result differs from the source")
	}

	// A context that ended before the call starts nothing and keeps the
	// communicator usable.
	done, stop := context.WithCancel(ctx)
	stop()
	err = c.Broadcast(done, send.DevicePtr(), recv.DevicePtr(), n, 0, s)
	var ne *Error
	if !errors.As(err, &ne) || !errors.Is(err, context.Canceled) || ne.Aborted {
		t.Fatalf("broadcast with a cancelled context: %v", err)
	}
	if err := c.Broadcast(ctx, recv.DevicePtr(), recv.DevicePtr(), n, 0, s); err != nil {
		t.Fatalf("in-place broadcast after a cancelled one: %v", err)
	}
	if err := c.Broadcast(ctx, send.DevicePtr(), recv.DevicePtr(), n, 1, s); err == nil {
		t.Fatal("broadcast from root 1 of 1 rank succeeded")
	}

	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.Broadcast(ctx, send.DevicePtr(), recv.DevicePtr(), n, 0, s); !errors.Is(err, ErrClosed) {
		t.Fatalf("broadcast after Close: %v, want ErrClosed", err)
	}
	if err := c.Abort(); err != nil {
		t.Fatalf("Abort after Close: %v", err)
	}
}

// TestInitAbort makes rank 0 of a 2-rank communicator wait for a rank that
// never comes: the wait must end with the context and abort the init.
func TestInitAbort(t *testing.T) {
	d := testDevice(t)
	for _, mode := range []string{"deadline", "cancel"} {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			want := context.DeadlineExceeded
			if mode == "cancel" {
				time.AfterFunc(time.Second, cancel)
				want = context.Canceled
			}
			id, err := NewUniqueID()
			if err != nil {
				t.Fatal(err)
			}
			type result struct {
				c   *Comm
				err error
			}
			res := make(chan result, 1)
			start := time.Now()
			go func() {
				c, err := NewComm(ctx, Config{Device: d, ID: id, NRanks: 2, Rank: 0, Label: "lonely"})
				res <- result{c, err}
			}()
			select {
			case r := <-res:
				var ne *Error
				if r.c != nil || !errors.As(r.err, &ne) || !ne.Aborted || !errors.Is(r.err, want) {
					t.Fatalf("NewComm without its peer = %v, %v; want an aborted *Error wrapping %v", r.c, r.err, want)
				}
				t.Logf("gave up and aborted in %v: %v", time.Since(start).Round(time.Millisecond), r.err)
			case <-time.After(60 * time.Second):
				t.Fatal("NewComm did not return within 60 s of a 2 s context: abort hung")
			}
		})
	}
}

const childEnv = "WEIGHTCAST_NCCL_TEST_CHILD"

// TestLibraryFromEnv loads a Python wheel's NCCL through
// WEIGHTCAST_NCCL_LIBRARY in a child process (one NCCL per process).
func TestLibraryFromEnv(t *testing.T) {
	testDevice(t)
	var wheel string
	for _, c := range candidates(Options{}, func(k string) string {
		if k == LibraryEnv {
			return ""
		}
		return os.Getenv(k)
	}, exec.LookPath) {
		if c.path != DefaultLibrary {
			wheel = c.path
			break
		}
	}
	if wheel == "" {
		t.Skip("skipping: no Python wheel copy of NCCL (site-packages/nvidia/nccl/lib) on this machine")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestLibraryFromEnvChild$", "-test.v")
	cmd.Env = append(SafeEnv(nil), LibraryEnv+"="+wheel, childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestLibraryFromEnvChild") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "loaded NCCL") {
			t.Log(strings.TrimSpace(line))
		}
	}
	v, _ := Version()
	t.Logf("this process: NCCL %s from %s", v, LoadedPath())
}

func TestLibraryFromEnvChild(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("runs only as the child process of TestLibraryFromEnv")
	}
	want := os.Getenv(LibraryEnv)
	v, err := Version()
	if err != nil {
		t.Fatal(err)
	}
	if !sameFile(LoadedPath(), want) {
		t.Fatalf("loaded %s, want %s", LoadedPath(), want)
	}
	if _, err := NewUniqueID(); err != nil {
		t.Fatal(err)
	}
	fmt.Printf("loaded NCCL %s from %s\n", v, LoadedPath())
}
