package gpu

import (
	"fmt"
	"sync"

	"github.com/weightcast/weightcast/mem"
)

// CopyBatch collects pointer-to-pointer copies that Stream.CopyBatch queues
// with one driver call. Addresses are device addresses (DevicePtr) or the
// addresses of pinned host memory (Address): with unified addressing the
// driver tells them apart, so one batch may mix host-to-device and
// device-to-device copies. Copies within a batch may run in any order and
// must not overlap.
//
// A CopyBatch is reused across calls (Reset keeps its arrays), so steady
// use allocates nothing. It is not safe for concurrent use.
type CopyBatch struct {
	dsts, srcs, sizes []uint64
	bytes             int64
	// PerCopy forces one cuMemcpyAsync per copy instead of
	// cuMemcpyBatchAsync, to compare the two or to work around a driver.
	PerCopy bool
}

// Add appends a copy of n bytes from src to dst. It never merges copies:
// two copies that look contiguous may lie in different allocations that
// happen to be adjacent in the address space, and the driver refuses a
// copy that spans allocations (CUDA_ERROR_INVALID_VALUE). Callers that know
// better use Extend.
func (b *CopyBatch) Add(dst, src uint64, n int64) {
	if n <= 0 {
		return
	}
	b.bytes += n
	b.dsts = append(b.dsts, dst)
	b.srcs = append(b.srcs, src)
	b.sizes = append(b.sizes, uint64(n))
}

// Extend grows the last copy by n bytes on both sides, for a caller that
// knows the bytes it adds lie in the same allocations as the copy (the next
// tensor of one source buffer, with the alignment padding before it). It
// reports false, changing nothing, when the batch is empty.
func (b *CopyBatch) Extend(n int64) bool {
	k := len(b.sizes) - 1
	if k < 0 || n < 0 {
		return false
	}
	b.sizes[k] += uint64(n)
	b.bytes += n
	return true
}

// Last returns the last copy's destination, source and size; ok is false
// when the batch is empty.
func (b *CopyBatch) Last() (dst, src uint64, n int64, ok bool) {
	k := len(b.sizes) - 1
	if k < 0 {
		return 0, 0, 0, false
	}
	return b.dsts[k], b.srcs[k], int64(b.sizes[k]), true
}

// Len is the number of copies collected.
func (b *CopyBatch) Len() int { return len(b.sizes) }

// Bytes is the number of bytes the collected copies move.
func (b *CopyBatch) Bytes() int64 { return b.bytes }

// Reset empties the batch, keeping its arrays.
func (b *CopyBatch) Reset() {
	b.dsts, b.srcs, b.sizes, b.bytes = b.dsts[:0], b.srcs[:0], b.sizes[:0], 0
}

// BatchPath says how the driver queued a batch of copies.
type BatchPath int

// The ways CopyBatch queues copies.
const (
	BatchNone    BatchPath = 0 // nothing queued yet
	BatchV2      BatchPath = 1 // cuMemcpyBatchAsync_v2 (CUDA 13 ABI)
	BatchV1      BatchPath = 2 // cuMemcpyBatchAsync (CUDA 12.8 ABI)
	BatchPerCopy BatchPath = 3 // one cuMemcpyAsync per copy
)

// String names the path for people.
func (p BatchPath) String() string {
	switch p {
	case BatchV2:
		return "cuMemcpyBatchAsync_v2"
	case BatchV1:
		return "cuMemcpyBatchAsync"
	case BatchPerCopy:
		return "cuMemcpyAsync per copy"
	}
	return "none"
}

var (
	batchMu       sync.Mutex
	lastBatchPath BatchPath
	batchFailure  error
)

// LastBatchPath reports how the most recent CopyBatch call of this process
// queued its copies, and the error of a batch call that failed and was
// replaced by per-copy calls (nil if none ever failed).
func LastBatchPath() (BatchPath, error) {
	batchMu.Lock()
	defer batchMu.Unlock()
	return lastBatchPath, batchFailure
}

// maxBatch bounds the copies handed to one driver call.
const maxBatch = 1 << 16

// CopyBatch queues every copy of b on s, in as few driver calls as the
// driver allows, then empties b. The sources must stay unchanged, and
// pinned host memory allocated, until the copies are known finished (an
// Event recorded after them). Where the driver lacks cuMemcpyBatchAsync
// (before CUDA 12.8), or the batch call fails, the copies are queued one
// by one with cuMemcpyAsync; LastBatchPath says which happened.
func (s *Stream) CopyBatch(b *CopyBatch) error {
	if err := s.check(); err != nil {
		return err
	}
	defer b.Reset()
	for start := 0; start < len(b.sizes); start += maxBatch {
		end := min(start+maxBatch, len(b.sizes))
		how, batchErr, r := copyBatch(s.d.ctx, b.dsts[start:end], b.srcs[start:end], b.sizes[start:end], s.s, b.PerCopy)
		batchMu.Lock()
		lastBatchPath = how
		if batchErr != 0 && batchFailure == nil {
			batchFailure = s.d.err("cuMemcpyBatchAsync", fmt.Sprintf("%d copies", end-start), batchErr)
		}
		batchMu.Unlock()
		if r != 0 {
			return s.d.err(how.String(), fmt.Sprintf("batch of %d copies, %d bytes", end-start, b.bytes), r)
		}
	}
	return nil
}

// Address returns the address that copies use for b: its DevicePtr for
// device memory, the address of its bytes for pinned host memory
// (AllocPinned). ok is false for ordinary Go memory, which the GPU cannot
// address, and for freed buffers.
func Address(b mem.Buffer) (addr uint64, ok bool) {
	switch v := Unfence(b).(type) {
	case *pinnedBuffer:
		if v.p == nil {
			return 0, false
		}
		return uint64(uintptr(v.p)), true
	case *deviceBuffer:
		if v.freed {
			return 0, false
		}
		return v.ptr, true
	case *viewBuffer:
		return v.ptr, true
	}
	if p := b.DevicePtr(); p != 0 {
		return p, true
	}
	return 0, false
}

// View returns a Buffer over n bytes of device memory at ptr that this
// package did not allocate (a tensor handed in by address, such as a
// PyTorch tensor's data_ptr()). The memory stays its owner's: the view's
// Free does nothing, and the owner must keep it allocated while copies use
// it.
func (d *CUDADevice) View(ptr uint64, n int) (mem.Buffer, error) {
	if ptr == 0 || n < 0 {
		return nil, fmt.Errorf("gpu: view of %d bytes at %#x on cuda:%d: need a non-zero address and a size of 0 or more", n, ptr, d.ordinal)
	}
	return &viewBuffer{dev: d, ptr: ptr, n: n}, nil
}

type viewBuffer struct {
	dev *CUDADevice
	ptr uint64
	n   int
}

func (v *viewBuffer) Len() int           { return v.n }
func (v *viewBuffer) Host() []byte       { return nil }
func (v *viewBuffer) DevicePtr() uint64  { return v.ptr }
func (v *viewBuffer) Device() mem.Device { return v.dev }
func (v *viewBuffer) Free() error        { return nil }

// Fenced is a Buffer whose contents are still being written by queued GPU
// work: Fence is the event that completes when the writes are done. Code
// that reads the buffer on the GPU makes its stream wait for the fence
// (Stream.WaitEvent); code that hands the buffer to another process waits
// for it on the host (Event.Wait). Every transport that takes device
// buffers honours fences.
type Fenced interface {
	mem.Buffer
	Fence() *Event
}

type fenced struct {
	mem.Buffer
	ev *Event
}

func (f *fenced) Fence() *Event { return f.ev }

// WithFence returns b marked as written by the work before e. The result
// forwards every Buffer method to b; Unfence returns b again. The caller
// keeps owning e and closes it once no one waits on it.
func WithFence(b mem.Buffer, e *Event) mem.Buffer {
	return &fenced{Buffer: Unfence(b), ev: e}
}

// FenceOf returns b's fence, or nil when b carries none.
func FenceOf(b mem.Buffer) *Event {
	if f, ok := b.(Fenced); ok {
		return f.Fence()
	}
	return nil
}

// Unfence returns the buffer that WithFence wrapped, or b itself.
func Unfence(b mem.Buffer) mem.Buffer {
	for {
		f, ok := b.(*fenced)
		if !ok {
			return b
		}
		b = f.Buffer
	}
}
