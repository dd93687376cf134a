package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// Views is a stages.Sink that hands a round to a consumer bucket by bucket, as
// views of whole tensors inside the received bucket, instead of copying
// them anywhere: the shape of verl's receive_weights and of a rollout
// engine's load_weights, which take (name, tensor) views valid until the
// next bucket.
//
// After the views of a bucket, the receiver's load stage (through Flush)
// sends them as one *Batch on Batches and waits until the consumer calls
// Batch.Release; only then is the bucket's buffer reused. A tensor split
// across buckets is assembled, chunk by chunk, into a buffer of its own
// (host memory from the Device given to NewViews for host buckets, device
// memory on the bucket's GPU for device buckets) and handed over with the
// bucket that completes it; those buffers are kept for the next rounds and
// freed by Close. A bucket that completes no tensor is not handed over.
//
// A direct bucket (read where it lies in the sender's memory: stages/direct.go)
// is handed over where it lies, its checksum checked there first
// (stages.InPlaceReader): its views are device ranges of the sender's
// allocations mapped here, valid, like any view, until Release.
//
// Every wait is bounded by the receiver's context and by the timeout given
// to NewViews: a consumer that does not take a batch, or holds one longer,
// fails the round with an error naming the bucket.
//
// The load stage calls the Sink methods from one goroutine; Batches is for
// the consumer, another goroutine. Close after the last round.
type Views struct {
	host    mem.Device
	timeout time.Duration
	batches chan *Batch

	version uint64
	index   int             // buckets handed over this round
	cur     []stages.View   // whole tensors of the bucket being loaded
	own     []bool          // which of cur were assembled
	fences  []*gpu.Event    // fences of the device views in cur
	parts   map[string]part // tensors split across buckets, by name
	stream  *gpu.Stream     // assembles device chunks; nil until needed
	copied  bool            // chunk copies queued on stream since the last Flush
}

// part is the buffer a split tensor is assembled in.
type part struct {
	buf mem.Buffer
	dev *gpu.CUDADevice // nil for host memory
}

// Batch is one bucket's whole tensors, handed to the consumer of a Views.
type Batch struct {
	// Version is the model version of the round.
	Version uint64
	// Index numbers the batches of a round from 0.
	Index int
	// Views are whole tensors (Entry.Whole() holds): host bytes in Data,
	// or device memory at Device[Offset:]. Valid until Release.
	Views []stages.View
	// Assembled marks the views of tensors split across buckets, which
	// lie in buffers of their own; the others lie in the bucket.
	Assembled []bool

	released chan *gpu.Event
}

// Release hands the batch back so that its bucket can be reused. after,
// when not nil, is an event recorded on the stream where the consumer
// queued its work on the views (copies, kernels): the bucket is reused only
// once it has completed, and Release takes over closing it. Only the first
// call has an effect.
func (b *Batch) Release(after *gpu.Event) {
	select {
	case b.released <- after:
	default:
		if after != nil {
			after.Close()
		}
	}
}

// NewViews returns a Views that assembles split tensors of host buckets in
// memory from host (mem.Host{} when nil) and bounds each wait for its
// consumer by timeout (transport.DefaultTimeout when 0). It starts nothing.
func NewViews(host mem.Device, timeout time.Duration) *Views {
	if host == nil {
		host = mem.Host{}
	}
	if timeout <= 0 {
		timeout = transport.DefaultTimeout
	}
	return &Views{host: host, timeout: timeout, batches: make(chan *Batch), parts: map[string]part{}}
}

// ReadsInPlace reports that Views takes direct buckets' views where they
// lie in the sender's memory (stages.InPlaceReader): its consumer copies them
// out itself.
func (v *Views) ReadsInPlace() bool { return true }

var _ stages.InPlaceReader = (*Views)(nil)

// Batches returns the channel each bucket's batch is sent on. It is never
// closed: a consumer selects on it and on the end of the receiver's round.
func (v *Views) Batches() <-chan *Batch { return v.batches }

var _ stages.DeviceSink = (*Views)(nil)

// Begin starts a round.
func (v *Views) Begin(ctx context.Context, version uint64, info *wire.SourceInfo) error {
	v.version, v.index, v.cur, v.own, v.fences = version, 0, nil, nil, v.fences[:0]
	return nil
}

// Load takes a view of host bytes, which stay valid until Flush returns
// (the DeviceSink rule), or copies a chunk of a split tensor into its
// buffer.
func (v *Views) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if e.Whole() {
		v.add(stages.View{Entry: e, Data: data}, false)
		return nil
	}
	p, err := v.part(e, nil)
	if err != nil {
		return err
	}
	copy(p.buf.Host()[e.Chunk:], data)
	if e.Complete() {
		v.add(stages.View{Entry: whole(e), Data: p.buf.Host()[:e.Total]}, true)
	}
	return nil
}

// LoadDevice takes a view of device memory, or queues the copy of a chunk
// of a split tensor into its buffer on the same GPU.
func (v *Views) LoadDevice(ctx context.Context, e *wire.Entry, src mem.Buffer, off int64) error {
	if ev := gpu.FenceOf(src); ev != nil && (len(v.fences) == 0 || v.fences[len(v.fences)-1] != ev) {
		v.fences = append(v.fences, ev)
	}
	if e.Whole() {
		v.add(stages.View{Entry: e, Device: src, Offset: off}, false)
		return nil
	}
	dev, err := cudaDeviceOf(src)
	if err != nil {
		return err
	}
	p, err := v.part(e, dev)
	if err != nil {
		return err
	}
	if v.stream == nil || v.stream.Device() != dev {
		if v.stream != nil {
			if err := v.settle(ctx); err != nil {
				return err
			}
			v.stream.Close()
		}
		if v.stream, err = dev.NewStream(); err != nil {
			return fmt.Errorf("views: %w", err)
		}
	}
	if ev := gpu.FenceOf(src); ev != nil {
		if err := v.stream.WaitEvent(ev); err != nil {
			return err
		}
	}
	if err := v.stream.CopyDtoD(p.buf, int(e.Chunk), gpu.Unfence(src), int(off), int(e.Size)); err != nil {
		return fmt.Errorf("assembling tensor %q: %w", e.Name, err)
	}
	v.copied = true
	if e.Complete() {
		v.add(stages.View{Entry: whole(e), Device: p.buf}, true)
	}
	return nil
}

func (v *Views) add(view stages.View, assembled bool) {
	v.cur = append(v.cur, view)
	v.own = append(v.own, assembled)
}

// part returns the buffer tensor e is assembled in, allocated (or
// reallocated, when its size or memory changed) at its first chunk.
func (v *Views) part(e *wire.Entry, dev *gpu.CUDADevice) (part, error) {
	p, ok := v.parts[e.Name]
	if ok && e.Chunk == 0 && (p.buf.Len() != int(e.Total) || p.dev != dev) {
		delete(v.parts, e.Name)
		if err := v.free(p); err != nil {
			return part{}, err
		}
		ok = false
	}
	if ok {
		return p, nil
	}
	if e.Chunk != 0 {
		return part{}, fmt.Errorf("tensor %q: chunk at byte %d arrived before its first", e.Name, e.Chunk)
	}
	var alloc mem.Device = v.host
	if dev != nil {
		alloc = dev
	}
	buf, err := alloc.Alloc(int(e.Total))
	if err != nil {
		return part{}, fmt.Errorf("allocating %d bytes on %s to assemble tensor %q, which is split across buckets: %w", e.Total, alloc.Name(), e.Name, err)
	}
	if dev == nil && buf.Host() == nil {
		buf.Free()
		return part{}, fmt.Errorf("views: %s does not give host memory to assemble tensor %q in", alloc.Name(), e.Name)
	}
	p = part{buf: buf, dev: dev}
	v.parts[e.Name] = p
	return p, nil
}

// free frees an assembly buffer once no copy into it is queued.
func (v *Views) free(p part) error {
	if p.dev != nil && v.stream != nil {
		ctx, cancel := context.WithTimeout(context.Background(), finalWait)
		defer cancel()
		if err := v.stream.Sync(ctx); err != nil {
			return err
		}
	}
	return p.buf.Free()
}

func whole(e *wire.Entry) *wire.Entry {
	w := *e
	w.Offset, w.Size, w.Chunk = 0, e.Total, 0
	return &w
}

// settle waits until the chunk copies queued so far have finished.
func (v *Views) settle(ctx context.Context) error {
	if !v.copied {
		return nil
	}
	if err := v.stream.Sync(ctx); err != nil {
		return fmt.Errorf("assembling split tensors: %w", err)
	}
	v.copied = false
	return nil
}

// Flush hands the bucket's whole tensors to the consumer and returns once
// the consumer has released them and the work it queued on them has
// finished, so that the bucket can be reused.
func (v *Views) Flush(ctx context.Context) error {
	if err := v.settle(ctx); err != nil {
		return err
	}
	for _, ev := range v.fences {
		if err := v.wait(ctx, ev, "the bucket's bytes to land"); err != nil {
			return err
		}
	}
	v.fences = v.fences[:0]
	if len(v.cur) == 0 {
		return nil
	}
	b := &Batch{Version: v.version, Index: v.index, Views: v.cur, Assembled: v.own, released: make(chan *gpu.Event, 1)}
	v.cur, v.own = nil, nil
	v.index++
	timer := time.NewTimer(v.timeout)
	defer timer.Stop()
	select {
	case v.batches <- b:
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return fmt.Errorf("views: nobody took batch %d of version %d within %v; a consumer must take every batch of a round", b.Index, b.Version, v.timeout)
	}
	var after *gpu.Event
	select {
	case after = <-b.released:
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-timer.C:
		return fmt.Errorf("views: batch %d of version %d was held for more than %v without being released", b.Index, b.Version, v.timeout)
	}
	if after == nil {
		return nil
	}
	defer after.Close()
	return v.wait(ctx, after, "the consumer's work on the views to finish")
}

// wait waits for ev, bounded by ctx and the timeout.
func (v *Views) wait(ctx context.Context, ev *gpu.Event, what string) error {
	wctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	if err := ev.Wait(wctx); err != nil {
		return fmt.Errorf("views: waiting for %s: %w", what, err)
	}
	return nil
}

// Commit ends the round.
func (v *Views) Commit(ctx context.Context, version uint64) error { return nil }

// Close frees the buffers split tensors were assembled in, after the copies
// into them. It is idempotent; the Views must not be used after it.
func (v *Views) Close() error {
	var errs []error
	for name, p := range v.parts {
		errs = append(errs, v.free(p))
		delete(v.parts, name)
	}
	if v.stream != nil {
		errs = append(errs, v.stream.Close())
		v.stream = nil
	}
	return errors.Join(errs...)
}
