package gpu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/weightcast/weightcast/mem"
)

// descSlots is how many launches of a full slot of descriptors (a kind's
// slotDescs) a descRing's memory holds. Smaller launches take only the
// descriptors they use, so many more of them can be queued ahead.
const descSlots = 4

// descFlight bounds the launches of a descRing in flight at once: past it
// the next launch waits for the oldest. Sixty-four launches of a bucket's
// checksum are the sums of 16 GiB in 256 MiB buckets, more than any lead
// the stages keep (stages.publishLead).
const descFlight = 64

// descKind describes a kernel that reads descriptors from a descRing
// (the ranges of Gather, the conversions of Caster), kernel(descs, count),
// one block per descriptor.
type descKind struct {
	name      string // "gather", "cast": in errors
	unit      string // the descriptors' name in errors: "ranges", "descriptors"
	words     int    // uint64 words per descriptor
	threads   int    // threads per block
	slotDescs int    // descriptors per slot; rings of other sizes (tests) are not kept as spares
	maxSpare  int    // the most rings' memory a device keeps for later rings
	spares    func(d *CUDADevice) *descSpares
}

// ring returns a ring of k's descriptors, without memory yet.
func (k *descKind) ring() descRing { return descRing{kind: k, slotDescs: k.slotDescs} }

// descSource hands out a kernel's descriptors, slot by slot.
type descSource interface {
	// done reports whether every descriptor has been handed out.
	done() bool
	// fill writes the next descriptors into out, until out is full or
	// the source is done, and returns how many it wrote.
	fill(out []uint64) int
}

// descRing is the descriptor memory of one kernel's launches on a stream:
// room for descSlots launches of slotDescs descriptors, in pinned host
// memory and in device memory, used as a ring. Each launch takes the
// descriptors it needs after the last launch's: queue writes them into
// the host memory, copies them to the device memory, launches the kernel
// over them and records an event, all on the stream, and rewrites
// descriptors only after the event of the launch that read them has
// completed. So a launch of few descriptors (a bucket of a few tensors)
// holds little of the ring, and a sender queues its round's checksums far
// ahead of the GPU rather than four launches ahead (docs/benchmarks.md,
// "Descriptor rings by the descriptor"). The memory is taken at first use
// from the device's spares of the kind (a pinned allocation costs hundreds
// of microseconds, too much for every round of a sync) or allocated, and
// close gives it back once no launch may read it. A descRing is not safe
// for concurrent use.
type descRing struct {
	kind      *descKind
	slotDescs int

	mem    *mirrorMem // nil until alloc, and after close
	flight []ringSpan // the launches that may still read the ring, oldest first
	head   int        // the descriptor after the last launch's
}

// ringSpan is the descriptors [start, end) of a descRing that a launch
// reads, and the event recorded after it.
type ringSpan struct {
	start, end int
	ev         *Event
}

// reserve places the next launch, of at most want descriptors, in a ring
// of size descriptors whose last launch ended at head, with flight in
// flight (oldest first): the launch starts at start (head, rounded up to
// an even number of words, or 0 when the rest of the ring is too short),
// and the oldest wait of flight must have finished before it is written,
// those that read [start, start+want) and all older ones (a stream runs
// its launches in order), or the oldest when flight has max launches.
func reserve(head, size, want, words int, flight []ringSpan, max int) (start, wait int) {
	start = head
	if start*words%2 != 0 {
		start++
	}
	if start+want > size {
		start = 0
	}
	end := start + want
	for i, f := range flight {
		if f.start < end && start < f.end {
			wait = i + 1
		}
	}
	if len(flight)-wait >= max {
		wait = len(flight) - max + 1
	}
	return start, wait
}

// alloc takes the ring's memory, unless it has it: a spare one of s's
// device, or new memory.
func (r *descRing) alloc(s *Stream) error {
	if r.mem != nil {
		return nil
	}
	size := descSlots * r.slotDescs * r.kind.words * 8
	if r.mem = r.kind.spares(s.d).take(size); r.mem != nil {
		return nil
	}
	m, err := s.d.allocMirror(size)
	if err != nil {
		return fmt.Errorf("gpu: %s descriptors: %w", r.kind.name, err)
	}
	r.mem = m
	return nil
}

// queue launches k on s over src's descriptors, at most slotDescs per
// launch, until src is done. For each launch it places the descriptors
// after the last launch's (reserve); waits, bounded by ctx, until the
// launches that read that part of the ring have finished; has src fill
// the host memory there; copies the n descriptors written to the device
// memory; launches k over them; and records the event that later launches
// over the same descriptors wait for. Call alloc first.
func (r *descRing) queue(ctx context.Context, s *Stream, k *loadedKernel, src descSource) error {
	return r.queueWith(ctx, s, src, func(dev uint64, n int) error {
		// kernel(descs, count): one block of threads per descriptor.
		if err := s.launch(k, n, r.kind.threads, dev, uint64(n)); err != nil {
			return fmt.Errorf("%s kernel over %d %s: %w", r.kind.name, n, r.kind.unit, err)
		}
		return nil
	})
}

// queueWith is queue with the launch of each n descriptors at the device
// address dev made by launch, for kernels that take more than the
// descriptors and their count.
func (r *descRing) queueWith(ctx context.Context, s *Stream, src descSource, launch func(dev uint64, n int) error) error {
	d := s.d
	words := r.kind.words
	for !src.done() {
		start, wait := reserve(r.head, descSlots*r.slotDescs, r.slotDescs, words, r.flight, descFlight)
		if wait > 0 {
			if err := r.flight[wait-1].ev.Wait(ctx); err != nil {
				return fmt.Errorf("gpu: %s on cuda:%d: waiting for a launch to finish reading descriptors %d..%d: %w",
					r.kind.name, d.ordinal, r.flight[wait-1].start, r.flight[wait-1].end, err)
			}
			for _, f := range r.flight[:wait] {
				f.ev.Close()
			}
			r.flight = slices.Delete(r.flight, 0, wait)
		}
		n := src.fill(r.mem.words[start*words : (start+r.slotDescs)*words])
		off := start * words * 8
		host := r.mem.host.Host()[off : off+n*words*8]
		dev := r.mem.dev.DevicePtr() + uint64(off)
		if res := cuMemcpyHtoDAsync(d.ctx, dev, host, s.s); res != 0 {
			return d.err("cuMemcpyHtoDAsync_v2", fmt.Sprintf("%d %s descriptors", n, r.kind.name), res)
		}
		// The descriptors are written from here on: a failure below must
		// not let the next launch rewrite them before the stream is past.
		r.head = start + n
		if err := launch(dev, n); err != nil {
			return errors.Join(err, r.track(s, start))
		}
		if err := r.track(s, start); err != nil {
			return err
		}
	}
	return nil
}

// track records on s the event after the launch that reads the ring's
// descriptors [start, head).
func (r *descRing) track(s *Stream, start int) error {
	ev, err := s.Record()
	if err != nil {
		return err
	}
	r.flight = append(r.flight, ringSpan{start: start, end: r.head, ev: ev})
	return nil
}

// close waits, bounded by ctx, until no launch queued on s reads the
// ring's memory any more, then gives the memory back to the device's
// spares (the device frees them on Close) or frees it. If the wait fails
// the memory stays allocated (rather than be reused under a running
// launch) and close returns the error; calling it again retries. close is
// idempotent.
func (r *descRing) close(ctx context.Context, s *Stream) error {
	if k := len(r.flight); k > 0 {
		if err := r.flight[k-1].ev.Wait(ctx); err != nil {
			return fmt.Errorf("gpu: %s on cuda:%d: descriptors kept allocated: %w", r.kind.name, s.d.ordinal, err)
		}
		for _, f := range r.flight {
			f.ev.Close()
		}
		r.flight = nil
	}
	r.head = 0
	m := r.mem
	if m == nil {
		return nil
	}
	r.mem = nil
	if r.slotDescs == r.kind.slotDescs && r.kind.spares(s.d).put(m, s.d, r.kind.maxSpare) {
		return nil
	}
	return m.free()
}

// descSpares is a device's descriptor memory of closed rings of one kind,
// for the next rings.
type descSpares struct {
	mu   sync.Mutex
	mems []*mirrorMem
}

// take returns a spare of size bytes, or nil if the last one kept is not
// of that size or none is kept.
func (sp *descSpares) take(size int) *mirrorMem {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	k := len(sp.mems) - 1
	if k < 0 || sp.mems[k].host.Len() != size {
		return nil
	}
	m := sp.mems[k]
	sp.mems = sp.mems[:k]
	return m
}

// put keeps m for later rings, unless most are kept already or d is
// closed (then the device's Close has freed the spares, or is freeing
// them), and reports whether it kept it.
func (sp *descSpares) put(m *mirrorMem, d *CUDADevice, most int) bool {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if len(sp.mems) >= most || d.closed.Load() {
		return false
	}
	sp.mems = append(sp.mems, m)
	return true
}

// free frees the spares, before the device's Close releases its context.
func (sp *descSpares) free() error {
	sp.mu.Lock()
	mems := sp.mems
	sp.mems = nil
	sp.mu.Unlock()
	var errs []error
	for _, m := range mems {
		errs = append(errs, m.free())
	}
	return errors.Join(errs...)
}

// mirrorMem is pinned host memory and device memory of one size, the host
// side viewed as uint64 words, that streams copy between.
type mirrorMem struct {
	host, dev mem.Buffer
	words     []uint64 // host
}

// allocMirror allocates size bytes (a multiple of 8) of pinned host
// memory and of device memory on d.
func (d *CUDADevice) allocMirror(size int) (*mirrorMem, error) {
	host, err := d.AllocPinned(size)
	if err != nil {
		return nil, err
	}
	dev, err := d.Alloc(size)
	if err != nil {
		host.Free()
		return nil, err
	}
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&host.Host()[0])), size/8)
	return &mirrorMem{host: host, dev: dev, words: words}, nil
}

// free frees both sides; no work queued on a stream may still use them.
func (m *mirrorMem) free() error { return errors.Join(m.host.Free(), m.dev.Free()) }
