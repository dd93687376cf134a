package transporttest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/weightcast/weightcast/mem"
)

// Memory is where a transport's buffers live in the conformance suite:
// HostMemory, or a GPU's memory (package gputest's CUDAMemory) for
// transports that move device buffers. The suite opens one Device per rank,
// in the test process and in child processes alike.
type Memory interface {
	// Name names the memory in messages: "host", "cuda".
	Name() string
	// Devices returns how many devices ranks can be placed on. Where the
	// memory is absent (no GPU) it skips tb, saying why, and where it is
	// present but broken it fails tb.
	Devices(tb testing.TB) int
	// Open opens device ordinal for one rank. Close the Device when done.
	Open(ordinal int) (Device, error)
}

// Device is one rank's device as the suite drives it: where the rank's
// buffers are allocated, and the copies that fill and check them. Its
// methods may be called on several goroutines at once.
type Device interface {
	// Mem is the device that the rank's transport.Config carries and its
	// buffers come from (a *gpu.CUDADevice for CUDA).
	Mem() mem.Device
	// Pack writes data at the start of b as the pack stage leaves a
	// bucket and returns the buffer to hand to Broadcast: on a GPU the
	// copy is queued and the buffer returned is fenced behind it (the
	// device keeps the fence until b is packed again or it closes); on the
	// host the copy is done and b is returned.
	Pack(b mem.Buffer, data []byte) (mem.Buffer, error)
	// Write copies data into b at off and returns once it has landed.
	Write(ctx context.Context, b mem.Buffer, off int, data []byte) error
	// Read returns n bytes of b from off, after every copy into b queued
	// before it has landed: a copy, or for host memory the bytes
	// themselves, valid until b is next written.
	Read(ctx context.Context, b mem.Buffer, off, n int) ([]byte, error)
	// Close closes the device.
	Close() error
}

// HostMemory is ordinary Go memory (mem.Host), for transports that move
// host buffers. Any number of ranks share it.
type HostMemory struct{}

// Name returns "host".
func (HostMemory) Name() string { return "host" }

// Devices returns a number larger than any world: host memory is
// everywhere.
func (HostMemory) Devices(testing.TB) int { return 1 << 20 }

// Open returns the host's Device.
func (HostMemory) Open(int) (Device, error) { return hostDevice{}, nil }

type hostDevice struct{}

func (hostDevice) Mem() mem.Device { return mem.Host{} }

// hostBytes returns b's bytes [off, off+n).
func hostBytes(b mem.Buffer, off, n int) ([]byte, error) {
	h := b.Host()
	if h == nil {
		return nil, errors.New("transporttest: a buffer of host memory has no Host() bytes")
	}
	if off < 0 || n < 0 || off > len(h)-n {
		return nil, fmt.Errorf("transporttest: bytes [%d, %d) outside the %d-byte buffer", off, off+n, len(h))
	}
	return h[off : off+n], nil
}

func (d hostDevice) Pack(b mem.Buffer, data []byte) (mem.Buffer, error) {
	return b, d.Write(context.Background(), b, 0, data)
}

func (hostDevice) Write(_ context.Context, b mem.Buffer, off int, data []byte) error {
	h, err := hostBytes(b, off, len(data))
	if err == nil {
		copy(h, data)
	}
	return err
}

func (hostDevice) Read(_ context.Context, b mem.Buffer, off, n int) ([]byte, error) {
	return hostBytes(b, off, n)
}

func (hostDevice) Close() error { return nil }
