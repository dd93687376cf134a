package nccl

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu/gputest"
)

// TestFakeLibrary runs one rank's life against stand-ins for libnccl.so.2
// and libcuda.so.1 built from C (gputest.RunWithFakes), which refuse a
// unique id that arrives changed, a config of another layout or a stream
// the CUDA stand-in did not make: it checks what crosses the cgo layer on
// machines without a GPU. The GPU tests check the same calls on NCCL.
func TestFakeLibrary(t *testing.T) { gputest.RunWithFakes(t, "TestFakeLibraryChild") }

// TestFakeLibraryChild is the child side of TestFakeLibrary.
func TestFakeLibraryChild(t *testing.T) {
	gputest.InFakeChild(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if v, err := Version(); err != nil || v.String() != "2.28.3" {
		t.Fatalf("Version = %v, %v; want the stand-in's 2.28.3", v, err)
	}
	if got, want := LoadedPath(), os.Getenv(LibraryEnv); !sameFile(got, want) {
		t.Fatalf("LoadedPath = %q, want %q", got, want)
	}
	d := gputest.Open(t, 0)
	s := gputest.Stream(t, d)
	id, err := NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}

	c, err := NewComm(ctx, Config{Device: d, ID: id, NRanks: 1, Rank: 0, Label: "fake"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 1<<20 + 3
	want := bytes.Repeat([]byte{1, 2, 3, 5, 8, 13, 21}, n/7+1)[:n]
	a, b := gputest.Alloc(t, d, n), gputest.Alloc(t, d, n)
	gputest.Upload(t, s, a, 0, want)
	gputest.Sync(t, s)
	if err := c.Broadcast(ctx, a.DevicePtr(), b.DevicePtr(), n, 0, s); err != nil {
		t.Fatal(err)
	}
	if got := gputest.Download(t, s, b, 0, n); !bytes.Equal(got, want) {
		t.Fatalf("broadcast bytes differ at %d", gputest.FirstDiff(got, want))
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// An aborted communicator.
	c, err = NewComm(ctx, Config{Device: d, ID: id, NRanks: 1, Rank: 0})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := c.Broadcast(ctx, a.DevicePtr(), b.DevicePtr(), n, 0, s); !errors.Is(err, ErrClosed) {
		t.Fatalf("Broadcast after Abort: %v, want ErrClosed", err)
	}

	// An id that is not the one NCCL made: the stand-in refuses it, and
	// its last error reaches the message.
	id[5] ^= 1
	_, err = NewComm(ctx, Config{Device: d, ID: id, NRanks: 1, Rank: 0})
	var e *Error
	if !errors.As(err, &e) || e.Result != InvalidArgument || e.Detail != "fake: the unique id arrived changed" || e.Aborted {
		t.Fatalf("NewComm with a changed id: %#v", err)
	}
}
