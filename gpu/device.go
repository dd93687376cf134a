package gpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/weightcast/weightcast/mem"
)

// CUDADevice is one GPU, used through its primary context. Every method may
// be called from any goroutine: each driver call makes the context current
// on its own OS thread first.
//
// Close the device after freeing its buffers and closing its streams and
// events: Close releases the primary context, and releasing the last
// reference frees everything allocated in it.
type CUDADevice struct {
	ordinal int
	dev     cuDevice
	ctx     cuContext
	name    string
	closed  atomic.Bool

	kernels deviceKernels // the kernels, their spare descriptor memory, and the multiprocessor count
}

var _ mem.Device = (*CUDADevice)(nil)

// NewCUDADevice opens device ordinal (0-based, as in cuda:0) and retains its
// primary context. The error wraps ErrNoDriver where no driver is installed.
func NewCUDADevice(ordinal int) (*CUDADevice, error) {
	if err := OpenCUDA(); err != nil {
		return nil, err
	}
	n, err := DeviceCount()
	if err != nil {
		return nil, err
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("gpu: no device cuda:%d: the driver sees %d device(s); check CUDA_VISIBLE_DEVICES", ordinal, n)
	}
	d := &CUDADevice{ordinal: ordinal}
	var r CUDAResult
	if d.dev, r = cuDeviceGet(ordinal); r != 0 {
		return nil, d.err("cuDeviceGet", "", r)
	}
	if d.name, r = cuDeviceGetName(d.dev); r != 0 {
		return nil, d.err("cuDeviceGetName", "", r)
	}
	if d.ctx, r = cuDevicePrimaryCtxRetain(d.dev); r != 0 {
		return nil, d.err("cuDevicePrimaryCtxRetain", "", r)
	}
	return d, nil
}

func (d *CUDADevice) err(op, detail string, r CUDAResult) error {
	return &Error{Op: op, Device: d.ordinal, Detail: detail, Result: r}
}

var errDeviceClosed = errors.New("gpu: device closed")

func (d *CUDADevice) checkOpen() error {
	if d.closed.Load() {
		return fmt.Errorf("%w: cuda:%d", errDeviceClosed, d.ordinal)
	}
	return nil
}

// Name returns the product name and ordinal, "NVIDIA H200 (cuda:0)".
func (d *CUDADevice) Name() string { return fmt.Sprintf("%s (cuda:%d)", d.name, d.ordinal) }

// Kind returns KindCUDA.
func (d *CUDADevice) Kind() mem.Kind { return mem.KindCUDA }

// Ordinal returns the device's index as the driver counts them.
func (d *CUDADevice) Ordinal() int { return d.ordinal }

// Alloc returns n bytes of device memory (cuMemAlloc). The buffer's
// DevicePtr is its address and Host is nil; its contents are unspecified.
// Free it with Free.
func (d *CUDADevice) Alloc(n int) (mem.Buffer, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("gpu: cannot allocate %d bytes on cuda:%d", n, d.ordinal)
	}
	p, r := cuMemAlloc(d.ctx, n)
	if r != 0 {
		return nil, d.err("cuMemAlloc_v2", fmt.Sprintf("%d bytes", n), r)
	}
	return &deviceBuffer{dev: d, ptr: p, n: n}, nil
}

// MemInfo returns the device's free and total memory in bytes.
func (d *CUDADevice) MemInfo() (free, total uint64, err error) {
	if err := d.checkOpen(); err != nil {
		return 0, 0, err
	}
	f, t, r := cuMemGetInfo(d.ctx)
	if r != 0 {
		return 0, 0, d.err("cuMemGetInfo_v2", "", r)
	}
	return f, t, nil
}

// LockContext wires the calling goroutine to its OS thread and makes the
// device's primary context current there, for libraries loaded beside this
// package (NCCL) whose calls read the thread's current context. Call unlock,
// on the same goroutine, when those calls are done; calling it again does
// nothing.
func (d *CUDADevice) LockContext() (unlock func(), err error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	if r := cuCtxSetCurrent(d.ctx); r != 0 {
		runtime.UnlockOSThread()
		return nil, d.err("cuCtxSetCurrent", "", r)
	}
	var once sync.Once
	return func() { once.Do(runtime.UnlockOSThread) }, nil
}

// Close releases the device's primary context. Free buffers and close
// streams and events first. Close is idempotent.
func (d *CUDADevice) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	uerr := d.unloadKernels()
	if r := cuDevicePrimaryCtxRelease(d.dev); r != 0 {
		return errors.Join(uerr, d.err("cuDevicePrimaryCtxRelease_v2", "", r))
	}
	return uerr
}

// deviceBuffer is memory on a CUDA device: allocated with cuMemAlloc, or
// mapped from another process's allocation with cuIpcOpenMemHandle.
type deviceBuffer struct {
	dev    *CUDADevice
	ptr    uint64
	n      int
	opened bool // mapped from an IPC handle: Free closes the mapping
	freed  bool
}

func (b *deviceBuffer) Len() int           { return b.n }
func (b *deviceBuffer) Host() []byte       { return nil }
func (b *deviceBuffer) Device() mem.Device { return b.dev }

// DevicePtr returns the buffer's device address, or 0 once freed.
func (b *deviceBuffer) DevicePtr() uint64 {
	if b.freed {
		return 0
	}
	return b.ptr
}

// Free returns the memory with cuMemFree, or, for a buffer opened from an
// IPC handle, unmaps it with cuIpcCloseMemHandle (the exporter still owns
// the memory). Work queued on streams that uses the buffer must be finished.
func (b *deviceBuffer) Free() error {
	if b.freed {
		return nil
	}
	b.freed = true
	if b.opened {
		if r := cuIpcCloseMemHandle(b.dev.ctx, b.ptr); r != 0 {
			return b.dev.err("cuIpcCloseMemHandle", "", r)
		}
		return nil
	}
	if r := cuMemFree(b.dev.ctx, b.ptr); r != 0 {
		return b.dev.err("cuMemFree_v2", fmt.Sprintf("%d bytes", b.n), r)
	}
	return nil
}

// PinnedHost is the Device for page-locked host memory of one CUDA device
// (cuMemHostAlloc, portable to every context). Its buffers are host memory:
// Kind is KindHost, Host returns their bytes and DevicePtr returns 0, so
// code written for Host buffers takes them unchanged; copies between them
// and the GPU run asynchronously at full link speed. Use IsPinned to tell
// them from ordinary host buffers.
type PinnedHost struct{ d *CUDADevice }

var _ mem.Device = PinnedHost{}

// PinnedHost returns the Device that allocates pinned host memory through d.
func (d *CUDADevice) PinnedHost() PinnedHost { return PinnedHost{d} }

// Name returns "pinned host (cuda:N)".
func (p PinnedHost) Name() string { return fmt.Sprintf("pinned host (cuda:%d)", p.d.ordinal) }

// Kind returns KindHost: pinned memory is host memory that Go addresses.
func (p PinnedHost) Kind() mem.Kind { return mem.KindHost }

// Alloc is (*CUDADevice).AllocPinned.
func (p PinnedHost) Alloc(n int) (mem.Buffer, error) { return p.d.AllocPinned(n) }

// AllocPinned returns n bytes of page-locked host memory allocated by the
// driver. Host() views that C memory as a Go slice (unsafe.Slice): the
// caller owns the buffer and must Free it, after every copy that uses it has
// finished, and must not touch the slice after Free. The garbage collector
// neither sees nor frees this memory.
func (d *CUDADevice) AllocPinned(n int) (mem.Buffer, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("gpu: cannot allocate %d pinned bytes", n)
	}
	p, r := cuMemHostAlloc(d.ctx, n)
	if r != 0 {
		return nil, d.err("cuMemHostAlloc", fmt.Sprintf("%d bytes", n), r)
	}
	return &pinnedBuffer{dev: d, p: p, b: unsafe.Slice((*byte)(p), n)}, nil
}

type pinnedBuffer struct {
	dev *CUDADevice
	p   unsafe.Pointer // C memory from cuMemHostAlloc
	b   []byte
}

func (b *pinnedBuffer) Len() int           { return len(b.b) }
func (b *pinnedBuffer) Host() []byte       { return b.b }
func (b *pinnedBuffer) DevicePtr() uint64  { return 0 }
func (b *pinnedBuffer) Device() mem.Device { return PinnedHost{b.dev} }

// Free returns the memory with cuMemFreeHost.
func (b *pinnedBuffer) Free() error {
	if b.p == nil {
		return nil
	}
	p := b.p
	b.p, b.b = nil, nil
	if r := cuMemFreeHost(b.dev.ctx, p); r != 0 {
		return b.dev.err("cuMemFreeHost", "", r)
	}
	return nil
}

// IsPinned reports whether b is page-locked host memory from AllocPinned.
func IsPinned(b mem.Buffer) bool {
	_, ok := b.(*pinnedBuffer)
	return ok
}
