package gpu

import (
	"encoding/hex"
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
