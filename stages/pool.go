package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/weightcast/weightcast/mem"
)

// DefaultBuffers is the number of bucket buffers in a pool: two, so that
// filling one overlaps moving the other.
const DefaultBuffers = 2

// Pool is a fixed set of equally sized bucket buffers. Its free list is a
// channel whose capacity is the number of buffers, so taking a buffer blocks
// while all are in use: with two buffers this is the double buffering.
type Pool struct {
	free chan mem.Buffer
	all  []mem.Buffer
	size int

	mu      sync.Mutex
	held    int
	maxHeld int
	closed  bool
	// fill is a device pool's pack state kept between rounds (see
	// deviceFill.endRound); nil while a Pack holds it, and for host pools.
	fill *deviceFill
	// staging is a receiving pool's Load staging kept between rounds
	// (see loadFrom); nil while a Load holds it.
	staging *hostStaging
}

// NewPool allocates n buffers of size bytes each on dev.
func NewPool(dev mem.Device, n, size int) (*Pool, error) {
	if n < 1 {
		return nil, fmt.Errorf("bucket pool needs at least one buffer, got %d", n)
	}
	if size < MinBucketSize {
		return nil, fmt.Errorf("bucket size %d bytes is below the minimum of %d; use --bucket 1KiB or more", size, MinBucketSize)
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
func (p *Pool) Bucket(buf mem.Buffer, meta BucketMeta) *Bucket {
	return &Bucket{Meta: meta, Buf: buf, put: p.Put}
}

// takeFill hands Pack the state an earlier round of this pool left, or nil.
func (p *Pool) takeFill() *deviceFill {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.fill
	p.fill = nil
	return f
}

// keepFill keeps f for the pool's next round. It reports false, keeping
// nothing, when the pool is closed or keeps another already.
func (p *Pool) keepFill(f *deviceFill) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.fill != nil {
		return false
	}
	p.fill = f
	return true
}

// takeStaging hands Load the staging an earlier round of this pool left,
// or a new one; so does a nil pool.
func (p *Pool) takeStaging() *hostStaging {
	if p == nil {
		return &hostStaging{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.staging
	p.staging = nil
	if st == nil {
		st = &hostStaging{}
	}
	return st
}

// keepStaging keeps st for the pool's next round once nothing queued on it
// is running (bounded by ctx, or finalWait once ctx is done); it closes st
// instead when that wait fails, the pool is nil or closed, or keeps one
// already.
func (p *Pool) keepStaging(ctx context.Context, st *hostStaging) error {
	if p == nil || st.stream == nil {
		return st.close(ctx)
	}
	if err := st.settle(ctx); err != nil {
		return err // the memory stays allocated rather than be freed under a copy
	}
	p.mu.Lock()
	keep := !p.closed && p.staging == nil
	if keep {
		p.staging = st
	}
	p.mu.Unlock()
	if keep {
		return nil
	}
	return st.close(ctx)
}

// Close frees every buffer, and the pack and load state kept between
// rounds of a device pool (waiting, at most a minute, for work still
// queued on its streams). It fails if some buffers are still out, naming how many, since
// freeing memory still in use would corrupt it.
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
	ctx, cancel := context.WithTimeout(context.Background(), finalWait)
	defer cancel()
	var errs []error
	if f := p.fill; f != nil {
		p.fill = nil
		errs = append(errs, f.close(ctx))
	}
	if st := p.staging; st != nil {
		p.staging = nil
		errs = append(errs, st.close(ctx))
	}
	return errors.Join(append(errs, p.freeAll())...)
}

func (p *Pool) freeAll() error {
	var errs []error
	for _, b := range p.all {
		errs = append(errs, b.Free())
	}
	return errors.Join(errs...)
}
