package mem

import (
	"errors"
	"fmt"
)

// Buffer is a fixed-size block of memory owned by one Device.
//
// A Buffer is not safe for concurrent Free; reads and writes of disjoint
// ranges from several goroutines are fine.
type Buffer interface {
	// Len is the buffer's size in bytes.
	Len() int
	// Host returns the bytes of the buffer when Go can address them
	// directly (host memory, pinned or not), and nil for device memory.
	Host() []byte
	// DevicePtr returns the device address of the buffer, or 0 when it
	// lives in plain host memory.
	DevicePtr() uint64
	// Device is the device that allocated the buffer.
	Device() Device
	// Free returns the memory. Calling Free twice is an error-free no-op.
	Free() error
}

// Device allocates Buffers. Kind tells callers which copy path applies:
// KindHost buffers are read and written through Host().
type Device interface {
	// Name describes the device for people ("host", "NVIDIA H200 (0)").
	Name() string
	// Kind says where the device's buffers live.
	Kind() Kind
	// Alloc returns a new buffer of n bytes. Its contents are unspecified.
	Alloc(n int) (Buffer, error)
}

// Kind says where a Device's memory lives.
type Kind string

// The kinds of Device.
const (
	KindHost Kind = "host"
	KindCUDA Kind = "cuda"
)

// ErrFreed is returned when a freed buffer is used.
var ErrFreed = errors.New("mem: buffer already freed")

// Host is the Device for ordinary Go-managed host memory. Its zero value is
// ready to use.
type Host struct{}

// Name returns "host".
func (Host) Name() string { return "host" }

// Kind returns KindHost.
func (Host) Kind() Kind { return KindHost }

// Alloc returns a zeroed host buffer of n bytes.
func (Host) Alloc(n int) (Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("mem: cannot allocate %d bytes", n)
	}
	return &hostBuffer{b: make([]byte, n)}, nil
}

type hostBuffer struct{ b []byte }

func (h *hostBuffer) Len() int          { return len(h.b) }
func (h *hostBuffer) Host() []byte      { return h.b }
func (h *hostBuffer) DevicePtr() uint64 { return 0 }
func (h *hostBuffer) Device() Device    { return Host{} }
func (h *hostBuffer) Free() error       { h.b = nil; return nil }
