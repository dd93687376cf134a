package gputest

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
)

// SyncTimeout bounds Sync and Download.
const SyncTimeout = 30 * time.Second

// SkipWithoutCUDA skips tb, saying "skipping: needs <need>: <why>", where
// the CUDA driver or a device is absent (need is "a CUDA GPU", "2 CUDA
// GPUs", ...), and fails it where the driver is there but cannot be
// opened.
func SkipWithoutCUDA(tb testing.TB, need string) {
	tb.Helper()
	err := gpu.OpenCUDA()
	if errors.Is(err, gpu.ErrNoDriver) || errors.Is(err, gpu.ErrNoDevice) {
		tb.Skipf("skipping: needs %s: %v", need, err)
	}
	if err != nil {
		tb.Fatal(err)
	}
}

// SkipWithoutDevices skips tb, saying "skipping: needs <n> GPUs<note>,
// found <m>", where the host has fewer than n GPUs. Call it after
// SkipWithoutCUDA.
func SkipWithoutDevices(tb testing.TB, n int, note string) {
	tb.Helper()
	if m, _ := gpu.DeviceCount(); m < n {
		tb.Skipf("skipping: needs %d GPUs%s, found %d", n, note, m)
	}
}

// Open opens CUDA device ordinal (the driver must be open: call
// SkipWithoutCUDA first) and closes it when tb ends. A failing Close is
// logged, not failed: a test that broke the context on purpose (a peer
// killed mid-broadcast) still passes.
func Open(tb testing.TB, ordinal int) *gpu.CUDADevice {
	tb.Helper()
	d, err := gpu.NewCUDADevice(ordinal)
	if err != nil {
		tb.Fatal(err)
	}
	closeAtEnd(tb, d.Name(), d.Close)
	return d
}

// Device opens the first CUDA device, closed when tb ends, or skips tb
// where there is none: "skipping: needs a CUDA GPU: <why>".
func Device(tb testing.TB) *gpu.CUDADevice {
	tb.Helper()
	SkipWithoutCUDA(tb, "a CUDA GPU")
	return Open(tb, 0)
}

// Stream makes a stream on d, closed when tb ends.
func Stream(tb testing.TB, d *gpu.CUDADevice) *gpu.Stream {
	tb.Helper()
	s, err := d.NewStream()
	if err != nil {
		tb.Fatal(err)
	}
	closeAtEnd(tb, "the stream", s.Close)
	return s
}

// Alloc allocates n bytes on d (a CUDA device, its pinned host memory, or
// the host), freed when tb ends.
func Alloc(tb testing.TB, d mem.Device, n int) mem.Buffer {
	tb.Helper()
	b, err := d.Alloc(n)
	if err != nil {
		tb.Fatal(err)
	}
	closeAtEnd(tb, "a buffer", b.Free)
	return b
}

// closeAtEnd runs close when tb ends and logs its error.
func closeAtEnd(tb testing.TB, what string, close func() error) {
	tb.Cleanup(func() {
		if err := close(); err != nil {
			tb.Logf("closing %s at the end of the test: %v", what, err)
		}
	})
}

// Sync waits, at most SyncTimeout, until everything queued on s has run.
func Sync(tb testing.TB, s *gpu.Stream) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), SyncTimeout)
	defer cancel()
	if err := s.Sync(ctx); err != nil {
		tb.Fatal(err)
	}
}

// Fill sets every byte of b to v on s and waits for it.
func Fill(tb testing.TB, s *gpu.Stream, b mem.Buffer, v byte) {
	tb.Helper()
	if err := s.Memset(b, 0, b.Len(), v); err != nil {
		tb.Fatal(err)
	}
	Sync(tb, s)
}

// Upload queues a copy of data into b at off on s; it does not wait.
func Upload(tb testing.TB, s *gpu.Stream, b mem.Buffer, off int, data []byte) {
	tb.Helper()
	if err := s.CopyHtoD(b, off, data); err != nil {
		tb.Fatal(err)
	}
}

// Download copies n bytes of b from off to the host on s, after what s
// has queued before, and returns them once they have landed.
func Download(tb testing.TB, s *gpu.Stream, b mem.Buffer, off, n int) []byte {
	tb.Helper()
	out := make([]byte, n)
	if err := s.CopyDtoH(out, b, off); err != nil {
		tb.Fatal(err)
	}
	Sync(tb, s)
	return out
}

// RandomBytes returns n bytes drawn from rng, one Uint32 a byte.
func RandomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// FirstDiff returns the index of the first byte where a and b differ (the
// shorter one's length where one is a prefix of the other), or -1 where
// they are equal.
func FirstDiff(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) == len(b) {
		return -1
	}
	return n
}
