package gpu

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// resultSlots is the pool of result slots of the kernels of one
// Checksummer, MACer or PolyMACer: device memory a kernel writes its result into
// (after scratch words of the kernel's own, which start zeroed and which
// the kernels leave zeroed when they finish), pinned host memory the
// result is copied into on the stream, and an event recorded after the
// copy. Slots are allocated a few at a time (one device and one pinned
// allocation for resultGrow slots), reused, and freed by close. A slot
// goes back to the pool only when its work is known finished, so memory a
// kernel may still write is never reused.
//
// take, queue and close are for the owner's goroutine; wait, read and
// release may be called on others (each slot by one goroutine at a time).
type resultSlots struct {
	s         *Stream
	name      string // "checksum", "MAC": the waits' name
	words     int    // uint64 words of result per slot, a multiple of 2 (16-byte aligned)
	scratch   int    // uint64 words in front of them, a multiple of 2: the kernels' own
	closedErr error  // ErrChecksummerClosed, ErrMACerClosed

	mu      sync.Mutex
	free    []*resultSlot        // ready for reuse
	retired []*resultSlot        // released unwaited: reused once their event completed
	busy    map[*resultSlot]bool // held by a pending result
	lost    int                  // slots whose queue failed before recording their event
	slots   []*resultSlot        // every slot, for close
	chunks  []*mirrorMem
	closed  bool // close began: queue refuses
	freed   bool // close freed the memory
}

// resultSlot is one slot of a resultSlots.
type resultSlot struct {
	dev  uint64   // the slot in device memory: scratch, then words uint64
	host []uint64 // the words' copy, in pinned host memory
	raw  []byte   // host's bytes, which the copy writes
	ev   *Event   // recorded after the copy
}

// resultGrow is the number of slots allocated at once when the pool runs
// dry.
const resultGrow = 8

// queue takes a slot and queues on the stream work, which writes the
// slot's device memory (its kernels), then the copy of the slot to pinned
// memory and the slot's event. If any of that fails, the slot goes back
// only once the stream has passed what was queued, and queue returns the
// error.
func (p *resultSlots) queue(work func(sl *resultSlot) error) (*resultSlot, error) {
	sl, err := p.take()
	if err != nil {
		return nil, err
	}
	err = work(sl)
	if err == nil {
		err = p.s.CopyDtoHPtr(sl.raw, sl.dev+uint64(p.scratch*8))
	}
	if err == nil {
		if err = sl.ev.recordOn(p.s); err == nil {
			return sl, nil
		}
	}
	// Some of the slot's work may be queued.
	if rerr := sl.ev.recordOn(p.s); rerr != nil {
		p.mu.Lock()
		delete(p.busy, sl) // lost until close syncs the stream and frees its chunk
		p.lost++
		p.mu.Unlock()
		return nil, errors.Join(err, rerr)
	}
	p.mu.Lock()
	delete(p.busy, sl)
	p.retired = append(p.retired, sl)
	p.mu.Unlock()
	return nil, err
}

// take returns a free slot, reclaiming retired ones whose work is done and
// growing the pool when none is free.
func (p *resultSlots) take() (*resultSlot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busy == nil {
		p.busy = map[*resultSlot]bool{}
	}
	keep := p.retired[:0]
	for _, s := range p.retired {
		if ok, err := s.ev.Query(); ok && err == nil {
			p.free = append(p.free, s)
		} else {
			keep = append(keep, s)
		}
	}
	clear(p.retired[len(keep):])
	p.retired = keep
	if len(p.free) == 0 {
		if err := p.grow(); err != nil {
			return nil, err
		}
	}
	s := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.busy[s] = true
	return s, nil
}

// grow allocates resultGrow slots: one device and one pinned allocation,
// and an event per slot; the device memory is zeroed on the stream, ahead
// of any kernel that will use it.
func (p *resultSlots) grow() error {
	d := p.s.d
	per := p.scratch + p.words
	m, err := d.allocMirror(resultGrow * per * 8)
	if err != nil {
		return fmt.Errorf("gpu: result slots: %w", err)
	}
	slots := make([]*resultSlot, 0, resultGrow)
	fail := func(err error) error {
		for _, s := range slots {
			s.ev.Close()
		}
		return errors.Join(fmt.Errorf("gpu: result slots: %w", err), m.free())
	}
	for i := range resultGrow {
		ev, err := d.newEvent()
		if err != nil {
			return fail(err)
		}
		slots = append(slots, &resultSlot{
			dev:  m.dev.DevicePtr() + uint64(i*per*8),
			host: m.words[i*per : i*per+p.words],
			raw:  m.host.Host()[i*per*8 : (i*per+p.words)*8],
			ev:   ev,
		})
	}
	if r := cuMemsetD8Async(d.ctx, m.dev.DevicePtr(), 0, resultGrow*per*8, p.s.s); r != 0 {
		return fail(d.err("cuMemsetD8Async", "zeroing the slots", r))
	}
	p.chunks = append(p.chunks, m)
	p.slots = append(p.slots, slots...)
	p.free = append(p.free, slots...)
	return nil
}

// wait waits until sl's work has finished, at most until ctx ends (then it
// returns a *WaitError); what names the result in errors ("the sum of 8
// bytes"). After close it fails with closedErr.
func (p *resultSlots) wait(ctx context.Context, sl *resultSlot, what string) error {
	return p.s.d.wait(ctx, p.name+" wait", func() (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.freed {
			return false, fmt.Errorf("%w before the %s was waited for", p.closedErr, what)
		}
		return sl.ev.Query()
	})
}

// read calls f with sl's host words, unless close has freed them (then it
// returns closedErr). Call it after wait.
func (p *resultSlots) read(sl *resultSlot, f func(host []uint64)) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.freed {
		return p.closedErr
	}
	f(sl.host)
	return nil
}

// release gives sl back: at once when waited is set (its work is known
// finished), else once its event has completed.
func (p *resultSlots) release(sl *resultSlot, waited bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.busy[sl] {
		return // the pool was closed and freed it
	}
	delete(p.busy, sl)
	if waited {
		p.free = append(p.free, sl)
	} else {
		p.retired = append(p.retired, sl)
	}
}

// close waits, bounded by ctx, until no work queued for a slot may still
// write it, then frees the slots; what names the owner in errors
// ("checksummer"). Pending
// results not yet waited for then fail with closedErr. If the wait fails,
// the memory stays allocated (rather than be freed under a running
// kernel), queue refuses, and close returns the error; calling it again
// retries. close is idempotent.
func (p *resultSlots) close(ctx context.Context, what string) error {
	p.mu.Lock()
	if p.freed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var evs []*Event
	for s := range p.busy {
		evs = append(evs, s.ev)
	}
	for _, s := range p.retired {
		evs = append(evs, s.ev)
	}
	lost := p.lost
	p.mu.Unlock()
	for _, ev := range evs {
		if err := ev.Wait(ctx); err != nil {
			return fmt.Errorf("gpu: %s on cuda:%d: slots kept allocated: %w", what, p.s.d.ordinal, err)
		}
	}
	if lost > 0 {
		// A slot lost to a failed queue (its event could not be
		// recorded) may be written by work still on the stream.
		if err := p.s.Sync(ctx); err != nil {
			return fmt.Errorf("gpu: %s on cuda:%d: slots kept allocated: %w", what, p.s.d.ordinal, err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, s := range p.slots {
		errs = append(errs, s.ev.Close())
	}
	for _, m := range p.chunks {
		errs = append(errs, m.free())
	}
	p.slots, p.free, p.retired, p.busy, p.chunks = nil, nil, nil, nil, nil
	p.freed = true
	return errors.Join(errs...)
}

// pendingResult is what PendingSum, PendingMAC and PendingPolyMAC share: a
// result of n bytes' work queued into slot of slots, read back once by
// wait and kept; or, with done set and no slot, a result known at once
// (computed on the host, or of no bytes).
type pendingResult[T any] struct {
	slots  *resultSlots // nil for a result known at once
	slot   *resultSlot  // nil for a result known at once, and once closed
	n      int64
	done   bool
	val    T
	closed bool
}

// queuedResult is the pending result of n bytes' work queued into sl.
func queuedResult[T any](slots *resultSlots, sl *resultSlot, n int64) pendingResult[T] {
	return pendingResult[T]{slots: slots, slot: sl, n: n}
}

// knownResult is the result v of n bytes, known at once.
func knownResult[T any](v T, n int64) pendingResult[T] {
	return pendingResult[T]{n: n, done: true, val: v}
}

// wait waits until the result's work has finished, at most until ctx ends
// (then it returns a *WaitError and the result stays pending), and returns
// finish of the slot's host words, the slots' name saying what in errors.
// Calling it again returns the same value, after close too.
func (p *pendingResult[T]) wait(ctx context.Context, finish func(host []uint64) T) (T, error) {
	var v T
	if p.done {
		return p.val, nil
	}
	what, ordinal := p.slots.name, p.slots.s.d.ordinal
	if p.closed {
		return v, fmt.Errorf("gpu: %s on cuda:%d: Wait after Close", what, ordinal)
	}
	if err := p.slots.wait(ctx, p.slot, fmt.Sprintf("%s of %d bytes", what, p.n)); err != nil {
		return v, fmt.Errorf("gpu: %s of %d bytes on cuda:%d: %w", what, p.n, ordinal, err)
	}
	if err := p.slots.read(p.slot, func(host []uint64) { v = finish(host) }); err != nil {
		return v, fmt.Errorf("gpu: %s of %d bytes on cuda:%d: %w", what, p.n, ordinal, err)
	}
	p.val, p.done = v, true
	return v, nil
}

// close gives the result's slot back: at once after a successful wait,
// else once its work is known finished. close is idempotent.
func (p *pendingResult[T]) close() {
	if p.closed {
		return
	}
	p.closed = true
	if s := p.slot; s != nil {
		p.slot = nil
		p.slots.release(s, p.done)
	}
}
