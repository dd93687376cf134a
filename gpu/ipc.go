package gpu

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/mem"
)

// IPCHandle names a device allocation so that another process on the same
// host can map it (cuIpcGetMemHandle). It is plain bytes, safe to send over
// any channel.
type IPCHandle [64]byte

// String returns the handle in hex.
func (h IPCHandle) String() string { return hex.EncodeToString(h[:]) }

// ParseIPCHandle decodes a handle written by IPCHandle.String.
func ParseIPCHandle(s string) (IPCHandle, error) {
	var h IPCHandle
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(h) {
		return h, fmt.Errorf("gpu: %q is not a %d-byte hex IPC handle", s, len(h))
	}
	copy(h[:], b)
	return h, nil
}

// ExportIPC returns the IPC handle of b, which must be a live buffer that
// Alloc of this GPU returned (a whole allocation, not one opened from a
// handle; a fenced one is unwrapped). The memory stays owned by this
// process: importers must close their mappings before b is freed.
func (d *CUDADevice) ExportIPC(b mem.Buffer) (IPCHandle, error) {
	var h IPCHandle
	db, ok := Unfence(b).(*deviceBuffer)
	switch {
	case !ok || db.dev.ordinal != d.ordinal:
		return h, fmt.Errorf("gpu: ExportIPC on cuda:%d needs a buffer that this device allocated, got one from %s", d.ordinal, b.Device().Name())
	case db.opened:
		return h, fmt.Errorf("gpu: cannot re-export a buffer opened from an IPC handle; export the original allocation")
	case db.freed:
		return h, mem.ErrFreed
	}
	if err := d.checkOpen(); err != nil {
		return h, err
	}
	h, r := cuIpcGetMemHandle(d.ctx, db.ptr)
	if r != 0 {
		return IPCHandle{}, d.err("cuIpcGetMemHandle", "", r)
	}
	return h, nil
}

// OpenIPC maps the n-byte allocation that another process exported as h
// (the handle does not carry the size). The returned buffer's Free unmaps it
// (cuIpcCloseMemHandle); the memory itself stays the exporter's. A process
// cannot open a handle it exported itself.
func (d *CUDADevice) OpenIPC(h IPCHandle, n int) (mem.Buffer, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("gpu: OpenIPC of %d bytes", n)
	}
	p, r := cuIpcOpenMemHandle(d.ctx, &h)
	if r != 0 {
		return nil, d.err("cuIpcOpenMemHandle_v2", "", r)
	}
	return &deviceBuffer{dev: d, ptr: p, n: n, opened: true}, nil
}

// ErrNotExportable is matched (errors.Is) by ExportAddress's error for
// memory that CUDA IPC cannot share: memory of the virtual memory
// management API (cuMemCreate and cuMemMap, which PyTorch's
// expandable_segments:True allocator uses), of a stream-ordered memory
// pool (cudaMallocAsync), or not device memory of this GPU at all.
var ErrNotExportable = errors.New("gpu: memory cannot be exported with CUDA IPC")

// AllocationInfo describes one device allocation (Allocation).
type AllocationInfo struct {
	// Base and Size place the allocation.
	Base uint64
	Size int64
	// ID is the driver's process-wide unique id of the allocation
	// (CU_POINTER_ATTRIBUTE_BUFFER_ID): an allocation made where a freed
	// one was has another, so a handle exported for one is never mistaken
	// for the other's.
	ID uint64
}

// Allocation returns the allocation that holds the device address p
// (cuMemGetAddressRange, cuPointerGetAttribute): for memory that some
// other code allocated (a cuMemAlloc of its own, a PyTorch caching
// allocator's segment, of which a tensor is a part), the unit that
// ExportAddress exports. Its error matches ErrNotExportable where p is no
// allocation the driver knows in this process.
func (d *CUDADevice) Allocation(p uint64) (AllocationInfo, error) {
	if err := d.checkOpen(); err != nil {
		return AllocationInfo{}, err
	}
	b, n, r := cuMemGetAddressRange(d.ctx, p)
	if r != 0 {
		return AllocationInfo{}, fmt.Errorf("%w: %#x is in no allocation the driver knows on cuda:%d: %w", ErrNotExportable, p, d.ordinal, d.err("cuMemGetAddressRange_v2", "", r))
	}
	id, err := d.AllocationID(b)
	if err != nil {
		return AllocationInfo{}, err
	}
	return AllocationInfo{Base: b, Size: int64(n), ID: id}, nil
}

// AllocationID returns the unique id of the allocation that holds p
// (see AllocationInfo.ID), one driver call: what tells a cached
// allocation from a new one at the same address.
func (d *CUDADevice) AllocationID(p uint64) (uint64, error) {
	if err := d.checkOpen(); err != nil {
		return 0, err
	}
	id, r := cuPointerGetBufferID(d.ctx, p)
	if r != 0 {
		return 0, fmt.Errorf("%w: %#x on cuda:%d: %w", ErrNotExportable, p, d.ordinal, d.err("cuPointerGetAttribute", "buffer id", r))
	}
	return id, nil
}

// ExportAddress returns the IPC handle of the allocation that starts at
// base (see Allocation), device memory of this GPU that this package need
// not have allocated. The memory stays owned by whoever allocated it, who
// must keep it allocated while importers use it. Memory that CUDA IPC
// cannot share fails with an error matching ErrNotExportable.
func (d *CUDADevice) ExportAddress(base uint64) (IPCHandle, error) {
	if err := d.checkOpen(); err != nil {
		return IPCHandle{}, err
	}
	h, r := cuIpcGetMemHandle(d.ctx, base)
	if r != 0 {
		return IPCHandle{}, fmt.Errorf("%w: the allocation at %#x on cuda:%d (memory of cuMemCreate, such as PyTorch's expandable segments, or of a stream-ordered pool cannot be shared): %w", ErrNotExportable, base, d.ordinal, d.err("cuIpcGetMemHandle", "", r))
	}
	return h, nil
}

// UUID returns the GPU's UUID (cuDeviceGetUuid_v2): the same in every
// process of the host, whatever ordinal CUDA_VISIBLE_DEVICES gives the
// GPU there, so processes tell by it whether they share a GPU.
func (d *CUDADevice) UUID() ([16]byte, error) {
	u, r := cuDeviceGetUuid(d.dev)
	if r != 0 {
		return u, d.err("cuDeviceGetUuid_v2", "", r)
	}
	return u, nil
}
