package gpu

import (
	"context"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/mem"
)

// Readback copies device memory back to pinned host memory of its own, on
// a stream of its own: for code that needs a device buffer's bytes on the
// host (a consumer that takes host bytes, a checksum where the GPU kernel is
// unavailable). The pinned buffer is allocated at the first Read, as large
// as the buffer read, grows only for a larger one, and is reused; the bytes
// Read returns stay valid until the next Read or Close.
//
// A Readback is for one goroutine at a time. Close it before closing its
// device.
type Readback struct {
	d   *CUDADevice
	s   *Stream    // nil until the first Read
	buf mem.Buffer // pinned; nil until the first Read
}

// NewReadback returns a Readback of d. It allocates nothing until the
// first Read.
func (d *CUDADevice) NewReadback() *Readback { return &Readback{d: d} }

// Read copies the first n bytes of b, device memory of the Readback's
// device, to pinned host memory, after b's fence if it carries one
// (WithFence), waits, bounded by ctx, until they have arrived, and returns
// them.
func (r *Readback) Read(ctx context.Context, b mem.Buffer, n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if n < 0 || n > b.Len() {
		return nil, fmt.Errorf("gpu: reading back %d bytes of a %d-byte buffer", n, b.Len())
	}
	if r.s == nil {
		s, err := r.d.NewStream()
		if err != nil {
			return nil, err
		}
		r.s = s
	}
	if r.buf == nil || r.buf.Len() < n {
		if err := r.settle(ctx); err != nil {
			return nil, err
		}
		if r.buf != nil {
			if err := r.buf.Free(); err != nil {
				return nil, err
			}
			r.buf = nil
		}
		buf, err := r.d.AllocPinned(max(b.Len(), n))
		if err != nil {
			return nil, fmt.Errorf("gpu: allocating pinned memory to read device memory back to the host: %w", err)
		}
		r.buf = buf
	}
	if ev := FenceOf(b); ev != nil {
		if err := r.s.WaitEvent(ev); err != nil {
			return nil, err
		}
	}
	host := r.buf.Host()[:n]
	if err := r.s.CopyDtoH(host, Unfence(b), 0); err != nil {
		return nil, err
	}
	if err := r.s.Sync(ctx); err != nil {
		return nil, err
	}
	return host, nil
}

// settle waits, bounded by ctx or, once ctx is done, by a minute, until no
// copy queued by Read is running.
func (r *Readback) settle(ctx context.Context) error {
	if r.s == nil {
		return nil
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	if err := r.s.Sync(ctx); err != nil {
		return fmt.Errorf("gpu: a copy back to the host is still running; leaving its pinned memory allocated: %w", err)
	}
	return nil
}

// Close waits, bounded by ctx or, once ctx is done, by a minute, until no
// copy writes the pinned memory, then frees it and the stream. If the wait
// fails it frees nothing and returns the error; calling it again retries.
// Close is idempotent.
func (r *Readback) Close(ctx context.Context) error {
	if r.s == nil {
		return nil
	}
	if err := r.settle(ctx); err != nil {
		return err
	}
	var errs []error
	if r.buf != nil {
		errs = append(errs, r.buf.Free())
	}
	errs = append(errs, r.s.Close())
	r.s, r.buf = nil, nil
	return errors.Join(errs...)
}
