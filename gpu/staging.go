package gpu

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weightcast/weightcast/dtype"
)

// The staging ring: host bytes into device memory at pinned speed.
//
// Host bytes (a tensor in Go memory, or behind a reader such as a file)
// reach device memory through a ring of Slots pinned slots of SlotSize
// bytes. The caller lays each range out in the current slot, mirroring its
// destination's alignment padding (StagingAlign) so that consecutive small
// ranges become one copy, and the ring hands the reads to a small set of
// reader goroutines in pieces of at most Piece bytes: one large range is
// read by several goroutines at once, and many small ones travel together
// in one piece. Reading from the page cache is a memcpy in the kernel at a
// few GB/s per thread, so it is the reads, not the copy engine, that need
// several threads.
//
// A slot whose reads have all finished has its host-to-device copies
// queued on the ring's stream, by the goroutine using the ring (which
// alone uses the stream), and an event recorded after them; it is refilled
// only once that event has completed. While that goroutine waits for a
// slot, it keeps queueing the copies of every other slot whose reads
// finish, so the copy engine is fed as the reads land. Drain seals the
// current slot and waits until every read has finished and its copies are
// queued, so that an event recorded on the stream afterwards follows every
// staged copy.
//
// The slots are pinned once, as the ring first reaches each, and kept until
// Close: pinning is slow (docs/benchmarks.md, "Figures behind the GPU
// defaults", the staging ring's sizes), and a weight sync stages round
// after round. The sizes the defaults use were chosen
// with stages' BenchmarkGPUCheckpoint; the measurements are in
// docs/benchmarks.md.

// StagingAlign is the alignment the ring mirrors: destinations lay ranges
// out on StagingAlign boundaries (wire.Align), so a range that continues
// the previous one across less than StagingAlign bytes of padding is
// staged as one copy, and reads are split on StagingAlign boundaries of
// their source (whole elements of any dtype).
const StagingAlign = 64

// Default staging sizes (DefaultStagingConfig): the pinned slots in the
// ring, the size of each, and the most bytes one reader reads at a time.
const (
	StagingSlots    = 8
	StagingSlotSize = 16 << 20
	StagingPiece    = 2 << 20
)

// stagingMaxReaders bounds the reader goroutines of DefaultStagingConfig:
// three quarters of GOMAXPROCS up to that (at least 2), leaving threads to
// the goroutine filling buckets and to the driver.
const stagingMaxReaders = 12

// stagingMaxOps bounds the reads (small ranges) one piece carries, so that
// the small ranges of a slot are spread over the readers too.
const stagingMaxOps = 256

// StagingConfig sizes a StagingRing.
type StagingConfig struct {
	Slots    int   // pinned slots in the ring
	SlotSize int64 // bytes per slot, a multiple of StagingAlign
	Piece    int64 // most bytes per read job, a multiple of StagingAlign
	Readers  int   // reader goroutines
	// PerCopy queues the copies out of a slot one cuMemcpyAsync each
	// instead of with one cuMemcpyBatchAsync (to compare the two).
	PerCopy bool
}

// DefaultStagingConfig returns the sizes stages' Pack uses: 8 slots of
// 16 MiB, 2 MiB pieces, and three quarters of GOMAXPROCS readers (2 to
// 12).
func DefaultStagingConfig() StagingConfig {
	return StagingConfig{
		Slots:    StagingSlots,
		SlotSize: StagingSlotSize,
		Piece:    StagingPiece,
		Readers:  min(stagingMaxReaders, max(2, runtime.GOMAXPROCS(0)*3/4)),
	}
}

// Check reports sizes a ring cannot work with.
func (c StagingConfig) Check() error {
	if c.Slots < 1 || c.Readers < 1 || c.SlotSize < StagingAlign || c.Piece < StagingAlign || c.SlotSize%StagingAlign != 0 || c.Piece%StagingAlign != 0 {
		return fmt.Errorf("gpu: bad staging sizes %+v: need at least one slot and one reader, slots and pieces whole multiples of %d bytes", c, StagingAlign)
	}
	return nil
}

// StagingSource is where staged bytes come from: ReadAt fills all of p
// with the bytes at off, or fails. The ring calls it from several reader
// goroutines at once, for different ranges.
type StagingSource interface {
	ReadAt(p []byte, off int64) error
}

// stagingGPU is what the ring asks of the GPU (a stream, or a fake in the
// tests). Only the goroutine using the ring calls it.
type stagingGPU interface {
	// alloc returns n bytes of pinned host memory, the address copies
	// use for it, and the function that frees it.
	alloc(n int) (host []byte, addr uint64, free func() error, err error)
	// queue queues the copies (and conversions) on the stream.
	queue(ctx context.Context, cs []stageCopy) error
	// record records an event after everything queued so far.
	record() (stagingEvent, error)
	// sync waits until everything queued so far has finished.
	sync(ctx context.Context) error
	// close frees what queue allocated (the conversions' scratch memory
	// and descriptors), once sync has succeeded.
	close(ctx context.Context) error
}

// stagingEvent is a recorded point of the stream (*Event).
type stagingEvent interface {
	Query() (bool, error)
	Close() error
}

// stageCopy is a copy of n bytes from staging (src) to the destination
// (dst), or, when to is set, a conversion of the n bytes of elements of
// type from at src into elements of type to at dst.
type stageCopy struct {
	dst, src uint64
	n        int64
	from, to dtype.DType
}

// slotState is where a staging slot is in its cycle.
type slotState int

const (
	slotFree    slotState = iota // nothing reads or writes it
	slotFilling                  // the current slot: reads dispatched, more may come
	slotReading                  // sealed; reads into it outstanding
	slotCopying                  // its copies queued; ev recorded after them
)

// stagingSlot is one pinned buffer of the ring.
type stagingSlot struct {
	host []byte
	addr uint64
	free func() error

	fill   int64        // bytes laid out, padding included
	copies []stageCopy  // out of the slot, queued once its reads finish
	state  slotState    // used by the ring's goroutine only
	ev     stagingEvent // recorded after the slot's copies (slotCopying)
	// pending counts the read jobs not finished, plus one while the slot
	// is being filled; whoever brings it to 0 reports the slot done.
	pending atomic.Int64
}

// readOp reads src's bytes at off into dst.
type readOp struct {
	src StagingSource
	off int64
	dst []byte
}

// readJob is one piece of work for a reader: reads into one slot.
type readJob struct {
	slot  *stagingSlot
	ops   []readOp
	bytes int64
}

// StagingRing stages host bytes into device memory through a ring of pinned
// slots (see the comment at the top of this file). Make it with
// (*Stream).NewStagingRing; its copies are queued on that stream.
//
// Its methods are for one goroutine at a time, the one that queues work on
// the stream. The first Copy or Convert after NewStagingRing or Stop starts
// the reader goroutines; Stop ends them (the caller's stage calls it
// before it returns), and Close frees the ring. The reader goroutines
// touch only the jobs they are given, the slots' pending counts, and the
// first read error.
type StagingRing struct {
	g      stagingGPU
	cfg    StagingConfig
	pinned int // slots allocated so far

	slots []*stagingSlot // allocated as the ring first reaches each
	cur   *stagingSlot   // the slot being filled, nil when none
	next  int            // the slot to fill after cur
	job   readJob        // cur's reads not yet handed to a reader
	nread int            // slots in slotReading

	run *readers // the readers started by the first Copy since Stop; nil when none run
}

// readers are the reader goroutines of one run of a ring, from the first
// Copy to Stop, and what they share with the ring's goroutine.
type readers struct {
	ctx    context.Context // the caller's, ended by a read error or Stop
	cancel context.CancelFunc
	jobs   chan readJob      // closed by Stop, the ring's goroutine being its only sender
	done   chan *stagingSlot // slots whose reads finished; never closed; room for every slot, so readers never block on it
	live   atomic.Int32      // readers running
	exited chan struct{}     // closed by the last reader to return
	closed bool              // jobs closed (the ring's goroutine only)

	mu  sync.Mutex
	err error // the first read error
}

// NewStagingRing returns a ring that stages host bytes into device memory
// of s's device, with copies queued on s. It checks cfg and allocates and
// starts nothing: slots are pinned as the ring first reaches them. Close it
// before closing s.
func (s *Stream) NewStagingRing(cfg StagingConfig) (*StagingRing, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return newStagingRing(&streamStaging{s: s, perCopy: cfg.PerCopy}, cfg)
}

func newStagingRing(g stagingGPU, cfg StagingConfig) (*StagingRing, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	return &StagingRing{g: g, cfg: cfg, slots: make([]*stagingSlot, cfg.Slots)}, nil
}

// Pinned returns the number of pinned slots the ring has allocated: at
// most Slots over its life.
func (r *StagingRing) Pinned() int { return r.pinned }

// start starts the readers, under ctx.
func (r *StagingRing) start(ctx context.Context) {
	run := &readers{
		jobs:   make(chan readJob, r.cfg.Slots*int(max(1, r.cfg.SlotSize/r.cfg.Piece))),
		done:   make(chan *stagingSlot, r.cfg.Slots),
		exited: make(chan struct{}),
	}
	run.ctx, run.cancel = context.WithCancel(ctx)
	run.live.Store(int32(r.cfg.Readers))
	r.run = run
	for range r.cfg.Readers {
		go run.read()
	}
}

// read runs read jobs until jobs is closed. Once the readers' context has
// ended it only accounts for the jobs left, without reading.
func (run *readers) read() {
	defer func() {
		if run.live.Add(-1) == 0 {
			close(run.exited)
		}
	}()
	for j := range run.jobs {
		for _, op := range j.ops {
			if run.ctx.Err() != nil {
				break
			}
			if err := op.src.ReadAt(op.dst, op.off); err != nil {
				run.fail(err)
				break
			}
		}
		if j.slot.pending.Add(-1) == 0 {
			run.done <- j.slot
		}
	}
}

// fail records the first read error and stops the other readers.
func (run *readers) fail(err error) {
	run.mu.Lock()
	if run.err == nil {
		run.err = err
	}
	run.mu.Unlock()
	run.cancel()
}

// readErr returns the first read error, if any.
func (run *readers) readErr() error {
	run.mu.Lock()
	defer run.mu.Unlock()
	return run.err
}

// stopped returns why the readers' context ended: a read error, else the
// caller's context error.
func (run *readers) stopped(ctx context.Context) error {
	if err := run.readErr(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("gpu: staging host bytes: %w", err)
	}
	return fmt.Errorf("gpu: staging host bytes: %w", context.Cause(run.ctx))
}

// Copy stages src's bytes [off, off+n) for the device address dst: it lays
// them out in the current slot, hands their reads to the readers and
// collects their copies, which are queued once the reads have finished, at
// the latest by Drain. dst lies in device memory of the ring's device, and
// ranges staged for one destination buffer follow each other on
// StagingAlign boundaries.
func (r *StagingRing) Copy(ctx context.Context, src StagingSource, dst uint64, n, off int64) error {
	return r.stage(ctx, src, dst, n, off, dtype.Invalid, dtype.Invalid)
}

// Convert stages src's bytes [off, off+n), elements of dtype from, and has
// the GPU cast kernel convert them to elements of dtype to at dst: n and
// off count source bytes, whole elements, and dst receives
// n / from.Size() × to.Size() bytes. The source bytes travel to device
// scratch memory of the ring first (one region per slot), then the kernel
// converts them, both queued before the slot's event. A conversion never
// merges with the copy before it. It fails, as (*Caster).Add does, where
// the kernel is unavailable.
func (r *StagingRing) Convert(ctx context.Context, src StagingSource, from, to dtype.DType, dst uint64, n, off int64) error {
	if from.Size() == 0 || n%int64(from.Size()) != 0 || off%int64(from.Size()) != 0 {
		return fmt.Errorf("gpu: staging a conversion %s→%s of %d bytes at %d: not whole elements", from, to, n, off)
	}
	return r.stage(ctx, src, dst, n, off, from, to)
}

func (r *StagingRing) stage(ctx context.Context, src StagingSource, dst uint64, n, off int64, from, to dtype.DType) error {
	if n == 0 {
		return nil
	}
	if r.g == nil {
		return errors.New("gpu: staging ring used after Close")
	}
	es, eo := int64(1), int64(1)
	if to != dtype.Invalid {
		es, eo = int64(from.Size()), int64(to.Size())
	}
	if r.run == nil {
		r.start(ctx)
	}
	if err := r.poll(); err != nil {
		return err
	}
	for done := int64(0); done < n; {
		sl, err := r.current(ctx)
		if err != nil {
			return err
		}
		d := dst + uint64(done/es*eo)
		pos, grow := alignUp(sl.fill), false
		// Mirror the destination's alignment padding, so that
		// consecutive small ranges become one copy (the last copy of
		// the slot ends at fill).
		if k := len(sl.copies) - 1; k >= 0 && to == dtype.Invalid && sl.copies[k].to == dtype.Invalid {
			if end := sl.copies[k].dst + uint64(sl.copies[k].n); d >= end && d-end < StagingAlign {
				pos, grow = sl.fill+int64(d-end), true
			}
		}
		if pos >= r.cfg.SlotSize {
			if err := r.seal(ctx); err != nil {
				return err
			}
			continue
		}
		m := min(n-done, r.cfg.SlotSize-pos) // whole elements: both are multiples of StagingAlign
		switch {
		case grow:
			sl.copies[len(sl.copies)-1].n += pos - sl.fill + m
		case to != dtype.Invalid:
			sl.copies = append(sl.copies, stageCopy{dst: d, src: sl.addr + uint64(pos), n: m, from: from, to: to})
		default:
			sl.copies = append(sl.copies, stageCopy{dst: d, src: sl.addr + uint64(pos), n: m})
		}
		if err := r.read(ctx, src, off+done, sl.host[pos:pos+m]); err != nil {
			return err
		}
		sl.fill = pos + m
		done += m
		if sl.fill == r.cfg.SlotSize {
			if err := r.seal(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

func alignUp(n int64) int64 { return (n + StagingAlign - 1) &^ (StagingAlign - 1) }

// read adds the reads of src's bytes at off into dst (in the current slot)
// to the open job, handing jobs to the readers as they fill. Jobs are split
// on StagingAlign boundaries of the source, so every read starts on an
// element.
func (r *StagingRing) read(ctx context.Context, src StagingSource, off int64, dst []byte) error {
	for len(dst) > 0 {
		k := int64(len(dst))
		if room := r.cfg.Piece - r.job.bytes; k > room {
			k = room &^ (StagingAlign - 1)
		}
		if k == 0 {
			if err := r.dispatch(ctx); err != nil {
				return err
			}
			continue
		}
		r.job.ops = append(r.job.ops, readOp{src: src, off: off, dst: dst[:k:k]})
		r.job.bytes += k
		off, dst = off+k, dst[k:]
		if r.job.bytes >= r.cfg.Piece || len(r.job.ops) >= stagingMaxOps {
			if err := r.dispatch(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// dispatch hands the open job to the readers.
func (r *StagingRing) dispatch(ctx context.Context) error {
	j := r.job
	r.job = readJob{slot: j.slot}
	if len(j.ops) == 0 {
		return nil
	}
	j.slot.pending.Add(1)
	select {
	case r.run.jobs <- j:
		return nil
	case <-r.run.ctx.Done():
		j.slot.pending.Add(-1) // never handed out
		return r.run.stopped(ctx)
	}
}

// current returns the slot being filled, starting the next one of the ring
// (allocating it the first time, else waiting until it is free) if none is.
func (r *StagingRing) current(ctx context.Context) (*stagingSlot, error) {
	if r.cur != nil {
		return r.cur, nil
	}
	sl := r.slots[r.next]
	if sl == nil {
		host, addr, free, err := r.g.alloc(int(r.cfg.SlotSize))
		if err != nil {
			return nil, err
		}
		r.pinned++
		sl = &stagingSlot{host: host, addr: addr, free: free}
		r.slots[r.next] = sl
	} else if err := r.await(ctx, sl); err != nil {
		return nil, err
	}
	r.next = (r.next + 1) % len(r.slots)
	sl.copies = sl.copies[:0]
	sl.fill, sl.state = 0, slotFilling
	sl.pending.Store(1)
	r.cur, r.job = sl, readJob{slot: sl}
	return sl, nil
}

// seal ends the filling of the current slot: its last job goes to the
// readers, and its copies are queued at once if its reads are done already.
func (r *StagingRing) seal(ctx context.Context) error {
	sl := r.cur
	if sl == nil {
		return nil
	}
	if err := r.dispatch(ctx); err != nil {
		return err
	}
	r.cur = nil
	sl.state = slotReading
	r.nread++
	if sl.pending.Add(-1) == 0 {
		return r.queue(ctx, sl)
	}
	return nil
}

// queue queues the copies out of sl, whose reads have all finished, and
// records the event after which it may be refilled. After a read error it
// queues nothing: the caller's round fails.
func (r *StagingRing) queue(ctx context.Context, sl *stagingSlot) error {
	if err := r.run.readErr(); err != nil {
		return err
	}
	r.nread--
	if len(sl.copies) > 0 {
		if err := r.g.queue(ctx, sl.copies); err != nil {
			return fmt.Errorf("gpu: queueing copies from pinned staging into device memory: %w", err)
		}
	}
	ev, err := r.g.record()
	if err != nil {
		return fmt.Errorf("gpu: recording a staging event: %w", err)
	}
	sl.ev, sl.state = ev, slotCopying
	return nil
}

// poll queues the copies of every slot whose reads have finished, without
// waiting, and reports a read error.
func (r *StagingRing) poll() error {
	if err := r.run.readErr(); err != nil {
		return err
	}
	for {
		select {
		case sl := <-r.run.done:
			if err := r.queue(r.run.ctx, sl); err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// awaitReads waits until the reads of some slot finish and queues its
// copies.
func (r *StagingRing) awaitReads(ctx context.Context) error {
	select {
	case sl := <-r.run.done:
		return r.queue(ctx, sl)
	case <-r.run.ctx.Done():
		// A read error, or the caller's context ended; prefer a
		// completion that raced with it only if there is no error.
		return r.run.stopped(ctx)
	}
}

// await waits until sl is free: its reads finished, its copies queued and
// completed. Meanwhile it queues the copies of other slots as their reads
// finish.
func (r *StagingRing) await(ctx context.Context, sl *stagingSlot) error {
	for {
		switch sl.state {
		case slotFree:
			return nil
		case slotReading:
			if err := r.awaitReads(ctx); err != nil {
				return err
			}
		case slotCopying:
			err := Poll(r.run.ctx, func() (bool, error) {
				if err := r.poll(); err != nil {
					return false, err
				}
				return sl.ev.Query()
			})
			if err != nil {
				if r.run.ctx.Err() != nil {
					return r.run.stopped(ctx)
				}
				return fmt.Errorf("gpu: waiting for a staging slot to drain: %w", err)
			}
			ev := sl.ev
			sl.ev, sl.state = nil, slotFree
			if err := ev.Close(); err != nil {
				return fmt.Errorf("gpu: destroying a staging event: %w", err)
			}
		default:
			return fmt.Errorf("gpu: staging slot in state %d cannot be reused", sl.state)
		}
	}
}

// Drain seals the current slot and waits until every read so far has
// finished and its copies are queued: after Drain, an event recorded on the
// stream follows every staged copy. It does not wait for the copies.
func (r *StagingRing) Drain(ctx context.Context) error {
	if r.run == nil {
		return nil
	}
	if err := r.seal(ctx); err != nil {
		return err
	}
	if err := r.poll(); err != nil {
		return err
	}
	for r.nread > 0 {
		if err := r.awaitReads(ctx); err != nil {
			return err
		}
	}
	return nil
}

// finalWait bounds the waits of Stop and Close once the caller's context is
// done, so that memory a reader or a copy may still use is never freed
// without a last bounded wait.
const finalWait = time.Minute

// bounded returns ctx, or, once ctx is done, a context of finalWait that
// keeps its values.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), finalWait)
}

// Stop ends the readers and waits until they have returned, bounded by ctx
// or, once ctx is done, by a minute. Reads in progress finish (a read
// cannot be interrupted); jobs not started are dropped, and so are the
// copies of slots whose reads had not all been handed out or finished, so
// call Drain first to keep them. The slots stay pinned for the next Copy,
// which starts new readers. Stop is idempotent.
func (r *StagingRing) Stop(ctx context.Context) error {
	run := r.run
	if run == nil {
		return nil
	}
	run.cancel()
	if !run.closed {
		run.closed = true
		close(run.jobs)
	}
	ctx, cancel := bounded(ctx)
	defer cancel()
	select {
	case <-run.exited:
	case <-ctx.Done():
		return fmt.Errorf("gpu: %d staging readers still reading; leaving the staging memory allocated: %w", run.live.Load(), ctx.Err())
	}
	// Every job is accounted for: forget the slots that were still being
	// filled or read (their copies were never queued).
	for _, sl := range r.slots {
		if sl != nil && (sl.state == slotFilling || sl.state == slotReading) {
			sl.state = slotFree
		}
	}
	r.cur, r.job, r.nread, r.run = nil, readJob{}, 0, nil
	return nil
}

// Close stops the readers, waits, bounded by ctx or, once ctx is done, by
// a minute, until every copy queued on the stream has finished, then frees
// the slots, their events and the conversions' memory. If a wait fails it
// frees nothing that a reader or a copy may still use, and returns the
// error; calling it again retries. Close is idempotent.
func (r *StagingRing) Close(ctx context.Context) error {
	if err := r.Stop(ctx); err != nil {
		return err
	}
	if r.g == nil {
		return nil
	}
	wctx, cancel := bounded(ctx)
	defer cancel()
	if err := r.g.sync(wctx); err != nil {
		return fmt.Errorf("gpu: staging copies still running; leaving the staging memory allocated: %w", err)
	}
	errs := []error{r.g.close(wctx)}
	for i, sl := range r.slots {
		if sl == nil {
			continue
		}
		if sl.ev != nil {
			errs = append(errs, sl.ev.Close())
		}
		errs = append(errs, sl.free())
		r.slots[i] = nil
	}
	r.g = nil
	return errors.Join(errs...)
}
