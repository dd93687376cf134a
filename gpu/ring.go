package gpu

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/weightcast/weightcast/mem"
)

// descSlots is the number of descriptor slots of a descRing, used in
// turn.
const descSlots = 4

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
// descSlots slots of slotDescs descriptors, in pinned host memory and in
// device memory. Each launch takes the next slot: queue writes the
// descriptors into the slot's host memory, copies them to its device
// memory, launches the kernel over them and records an event, all on the
// stream, and rewrites the slot only after that event has completed. The
// memory is taken at first use from the device's spares of the kind (a
// pinned allocation costs hundreds of microseconds, too much for every
// round of a sync) or allocated, and close gives it back once no launch
// may read it. A descRing is not safe for concurrent use.
type descRing struct {
	kind      *descKind
	slotDescs int

	mem  *mirrorMem        // nil until alloc, and after close
	done [descSlots]*Event // recorded after the last launch that read each slot
	slot int               // the next slot to use
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

// queue launches k on s over src's descriptors, one slot per launch,
// until src is done. For each slot it waits, bounded by ctx, until the
// launch that last read the slot has finished; has src fill the slot's
// host memory; copies the n descriptors written to the slot's device
// memory; launches k over them; and records the event that the slot's next
// use waits for. Call alloc first.
func (r *descRing) queue(ctx context.Context, s *Stream, k *loadedKernel, src descSource) error {
	return r.queueWith(ctx, s, src, func(dev uint64, n int) error {
		// kernel(descs, count): one block of threads per descriptor.
		if err := s.launch(k, n, r.kind.threads, dev, uint64(n)); err != nil {
			return fmt.Errorf("%s kernel over %d %s: %w", r.kind.name, n, r.kind.unit, err)
		}
		return nil
	})
}

// queueWith is queue with the launch of each slot's n descriptors at the
// device address dev made by launch, for kernels that take more than the
// descriptors and their count.
func (r *descRing) queueWith(ctx context.Context, s *Stream, src descSource, launch func(dev uint64, n int) error) error {
	d := s.d
	per := r.slotDescs * r.kind.words
	for !src.done() {
		slot := r.slot
		if ev := r.done[slot]; ev != nil {
			if err := ev.Wait(ctx); err != nil {
				return fmt.Errorf("gpu: %s on cuda:%d: waiting for descriptor slot %d: %w", r.kind.name, d.ordinal, slot, err)
			}
		}
		n := src.fill(r.mem.words[slot*per : (slot+1)*per])
		off := slot * per * 8
		host := r.mem.host.Host()[off : off+n*r.kind.words*8]
		dev := r.mem.dev.DevicePtr() + uint64(off)
		if res := cuMemcpyHtoDAsync(d.ctx, dev, host, s.s); res != 0 {
			return d.err("cuMemcpyHtoDAsync_v2", fmt.Sprintf("%d %s descriptors", n, r.kind.name), res)
		}
		if err := launch(dev, n); err != nil {
			return err
		}
		ev, err := s.Record()
		if err != nil {
			return err
		}
		if old := r.done[slot]; old != nil {
			old.Close()
		}
		r.done[slot] = ev
		r.slot = (slot + 1) % descSlots
	}
	return nil
}

// close waits, bounded by ctx, until no launch queued on s reads the
// ring's memory any more, then gives the memory back to the device's
// spares (the device frees them on Close) or frees it. If the wait fails
// the memory stays allocated (rather than be reused under a running
// launch) and close returns the error; calling it again retries. close is
// idempotent.
func (r *descRing) close(ctx context.Context, s *Stream) error {
	for i, ev := range r.done {
		if ev == nil {
			continue
		}
		if err := ev.Wait(ctx); err != nil {
			return fmt.Errorf("gpu: %s on cuda:%d: descriptors kept allocated: %w", r.kind.name, s.d.ordinal, err)
		}
		ev.Close()
		r.done[i] = nil
	}
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
