package gputest

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// CUDAMemory is the memory of this host's CUDA GPUs, for the transport
// conformance suite (transporttest.Suite.Memory). Each rank's Device is a
// *gpu.CUDADevice of its own with a stream of its own; Pack queues the
// upload and fences the bucket behind it, as the pack stage leaves device
// buckets.
type CUDAMemory struct{}

var _ transporttest.Memory = CUDAMemory{}

// Name returns "cuda".
func (CUDAMemory) Name() string { return "cuda" }

// Devices skips tb where there is no CUDA driver or GPU, fails it where the
// driver cannot be used, and returns how many GPUs the driver sees.
func (CUDAMemory) Devices(tb testing.TB) int {
	tb.Helper()
	SkipWithoutCUDA(tb, "a CUDA GPU")
	n, err := gpu.DeviceCount()
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// Open opens cuda:ordinal and a stream on it.
func (CUDAMemory) Open(ordinal int) (transporttest.Device, error) {
	d, err := gpu.NewCUDADevice(ordinal)
	if err != nil {
		return nil, err
	}
	s, err := d.NewStream()
	if err != nil {
		return nil, errors.Join(err, d.Close())
	}
	return &cudaDevice{d: d, s: s, fences: map[mem.Buffer]*gpu.Event{}}, nil
}

// cudaDevice is one rank's GPU. Its methods may be called on several
// goroutines at once (the pairs suite packs a sender's buckets for each of
// its receivers on a goroutine of their own): mu orders them.
type cudaDevice struct {
	d *gpu.CUDADevice

	mu     sync.Mutex
	s      *gpu.Stream
	fences map[mem.Buffer]*gpu.Event // the fence of each buffer's last Pack
}

func (c *cudaDevice) Mem() mem.Device { return c.d }

// Pack queues the copy of data into b and returns b fenced behind it. The
// fence of b's previous Pack is closed: that bucket's Broadcast has
// returned, and a stream still waiting on the event keeps it alive.
func (c *cudaDevice) Pack(b mem.Buffer, data []byte) (mem.Buffer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.s.CopyHtoD(b, 0, data); err != nil {
		return nil, err
	}
	ev, err := c.s.Record()
	if err != nil {
		return nil, err
	}
	if old := c.fences[b]; old != nil {
		old.Close()
	}
	c.fences[b] = ev
	return gpu.WithFence(b, ev), nil
}

func (c *cudaDevice) Write(ctx context.Context, b mem.Buffer, off int, data []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.s.CopyHtoD(b, off, data); err != nil {
		return err
	}
	return c.s.Sync(ctx)
}

func (c *cudaDevice) Read(ctx context.Context, b mem.Buffer, off, n int) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]byte, n)
	if err := c.s.CopyDtoH(out, b, off); err != nil {
		return nil, err
	}
	return out, c.s.Sync(ctx)
}

// Close waits (at most SyncTimeout) for the stream, then closes the fences,
// the stream and the device.
func (c *cudaDevice) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), SyncTimeout)
	defer cancel()
	errs := []error{c.s.Sync(ctx)}
	for _, ev := range c.fences {
		errs = append(errs, ev.Close())
	}
	errs = append(errs, c.s.Close(), c.d.Close())
	return errors.Join(errs...)
}
