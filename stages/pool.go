package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/wire"
)

// DefaultBuffers is the number of bucket buffers in a pool: two, so that
// filling one overlaps moving the other.
const DefaultBuffers = 2

// Pool is a fixed set of equally sized bucket buffers, and nothing else.
// Its free list is a channel whose capacity is the number of buffers, so
// taking a buffer blocks while all are in use: with two buffers this is the
// double buffering.
//
// A pool is its creator's: a Sender or Receiver takes buffers from it and
// gives them back, but never closes it. Close it after the Senders and
// Receivers that use it.
type Pool struct {
	free chan mem.Buffer
	all  []mem.Buffer
	size int

	mu      sync.Mutex
	held    int
	maxHeld int
	closed  bool
	none    mem.Buffer // noBytes' buffer, made once
}

// NewPool allocates n buffers of size bytes each on dev.
func NewPool(dev mem.Device, n, size int) (*Pool, error) {
	if n < 1 {
		return nil, fmt.Errorf("bucket pool needs at least one buffer, got %d", n)
	}
	if size < MinBucketSize {
		return nil, fmt.Errorf("bucket size %d bytes is below the minimum of %d; give every rank a bucket size of 1 KiB or more", size, MinBucketSize)
	}
	p := &Pool{free: make(chan mem.Buffer, n), size: size}
	for range n {
		b, err := dev.Alloc(size)
		if err != nil {
			p.freeAll()
			return nil, fmt.Errorf("allocating %d bucket buffers of %d bytes on %s: %w", n, size, dev.Name(), err)
		}
		p.all = append(p.all, b)
		p.free <- b
	}
	return p, nil
}

// BufferSize is the size of each buffer in bytes.
func (p *Pool) BufferSize() int { return p.size }

// onDevice reports whether the pool's buffers are device memory.
func (p *Pool) onDevice() bool { return len(p.all) > 0 && onDevice(p.all[0]) }

// Buffers returns every buffer of the pool, for transports that register
// or export them once (CUDA IPC).
func (p *Pool) Buffers() []mem.Buffer { return append([]mem.Buffer(nil), p.all...) }

// Get takes a free buffer, waiting while all are in use.
func (p *Pool) Get(ctx context.Context) (mem.Buffer, error) {
	select {
	case b := <-p.free:
		p.mu.Lock()
		p.held++
		p.maxHeld = max(p.maxHeld, p.held)
		p.mu.Unlock()
		return b, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// Put returns a buffer taken with Get.
func (p *Pool) Put(b mem.Buffer) {
	p.mu.Lock()
	p.held--
	p.mu.Unlock()
	p.free <- b // never blocks: the channel holds every buffer
}

// Held is the number of buffers taken and not yet returned.
func (p *Pool) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// MaxHeld is the most buffers that were out of the pool at once.
func (p *Pool) MaxHeld() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxHeld
}

// Bucket wraps buf in a Bucket whose Release returns buf to this pool.
func (p *Pool) Bucket(buf mem.Buffer, meta wire.BucketMeta) *Bucket {
	return &Bucket{Meta: meta, Buf: buf, put: p.Put}
}

// noBytes returns a buffer of no bytes on the GPU of the pool's buffers
// (the same one every call), for a direct bucket (direct.go): it holds
// none of the pool's buffers, and says on which GPU the bucket's tensors
// must lie. It fails for a pool of host buffers.
func (p *Pool) noBytes() (mem.Buffer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.none == nil {
		first := p.all[0]
		dev, err := cudaDeviceOf(first)
		if err != nil {
			return nil, err
		}
		addr, _ := gpu.Address(first)
		if p.none, err = dev.View(addr, 0); err != nil {
			return nil, err
		}
	}
	return p.none, nil
}

// directBucket wraps meta, a direct bucket's, in a Bucket that holds no
// buffer of the pool (its Buf is noBytes'), so that a receiver whose
// round reads direct buckets where they lie queues as many of them as
// the metadata window lets arrive; the receive stage takes a buffer
// (Bucket.ownBuffer) for one it gathers instead. It returns nil for a
// pool of host buffers, which cannot hold a direct bucket.
func (p *Pool) directBucket(meta wire.BucketMeta) *Bucket {
	buf, err := p.noBytes()
	if err != nil {
		return nil
	}
	return &Bucket{Meta: meta, Buf: buf, pool: p}
}

// Close frees every buffer. It fails if some buffers are still out, naming
// how many, since freeing memory still in use would corrupt it. Close is
// idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	if p.held != 0 {
		return fmt.Errorf("bucket pool closed with %d of %d buffers still in use", p.held, len(p.all))
	}
	p.closed = true
	return p.freeAll()
}

func (p *Pool) freeAll() error {
	var errs []error
	for _, b := range p.all {
		errs = append(errs, b.Free())
	}
	return errors.Join(errs...)
}
