package stages

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
)

// Staging host tensors into device buckets.
//
// Host tensors (Data or Reader) reach device buckets through a ring of
// StagingBuffers pinned slots of StagingSize bytes. The pack goroutine lays
// each tensor range out in the current slot, mirroring the bucket's
// alignment padding so that consecutive small tensors become one copy, and
// hands the reads to a small set of reader goroutines in pieces of at most
// stagingPiece bytes: one large tensor is read by several goroutines at
// once, and many small ones travel together in one piece. Reading from the
// page cache is a memcpy in the kernel at a few GB/s per thread, so it is
// the reads, not the copy engine, that need several threads.
//
// A slot whose reads have all finished has its host-to-device copies queued
// on the round's copy stream, by the pack goroutine (which alone uses the
// stream), and an event recorded after them; it is refilled only once that
// event has completed. While the pack goroutine waits for a slot, it keeps
// queueing the copies of every other slot whose reads finish, so the copy
// engine is fed as the reads land. Before a bucket's ready event is
// recorded, the current slot is sealed and every read into the bucket has
// finished and its copies are queued (drain).
//
// The slots outlive the round: close gives them to stagingSpares for the
// next round on the device, once the readers have stopped and every copy
// has finished.
//
// Sizes, measured with BenchmarkGPUCheckpoint on an H200 host of 16 cores
// (a 4 GiB checkpoint in the page cache into 1 GiB buckets; pinned
// host-to-device copies run at 55 GB/s there): reading from the page cache
// runs at about 4-6 GB/s per reader (45 GB/s with 8 readers, 65 with 12,
// 74 with 16, no copies), and the copies take memory bandwidth too: with
// 12 readers a round ran at 46-54 GB/s (0.83-0.98 of pinned copies, over
// four runs on shared hosts), with 8 at 36-51, with 14 or 16 at 47-51
// (the pack goroutine and the driver need threads too). 2 MiB pieces
// (1 MiB did the same, 4 MiB worse) split a 16 MiB slot among all readers
// and bound how long a cancelled reader takes to stop. 8 slots of 16 MiB
// keep the readers busy while slots are being copied (6 × 16 MiB and
// 8 × 8 MiB did about as well); 128 MiB pinned is small beside two device
// buckets, and pinning it is slow (62-85 ms to allocate and free the ring,
// as long as the whole round), hence stagingSpares.

// Staging sizes for host tensors packed into device buckets: the number of
// pinned slots in the ring and the size of each.
const (
	StagingBuffers = 8
	StagingSize    = 16 << 20
)

// stagingPiece is the most bytes one reader goroutine reads at a time.
const stagingPiece = 2 << 20

// stagingMaxReaders bounds the reader goroutines of a round; a round uses
// three quarters of GOMAXPROCS up to that (at least 2), leaving threads to
// the pack goroutine and the driver.
const stagingMaxReaders = 12

// stagingMaxOps bounds the reads (small tensors) one piece carries, so that
// the small tensors of a slot are spread over the readers too.
const stagingMaxOps = 256

// stagingConfig sizes the staging ring of one round.
type stagingConfig struct {
	slots    int   // pinned slots in the ring
	slotSize int64 // bytes per slot, a multiple of Align
	piece    int64 // most bytes per read job, a multiple of Align
	readers  int   // reader goroutines
}

// stagingDefaults returns the sizes Pack uses; tests and benchmarks replace
// it.
var stagingDefaults = func() stagingConfig {
	return stagingConfig{
		slots:    StagingBuffers,
		slotSize: StagingSize,
		piece:    stagingPiece,
		readers:  min(stagingMaxReaders, max(2, runtime.GOMAXPROCS(0)*3/4)),
	}
}

func (c stagingConfig) check() error {
	if c.slots < 1 || c.readers < 1 || c.slotSize < Align || c.piece < Align || c.slotSize%Align != 0 || c.piece%Align != 0 {
		return fmt.Errorf("pack: bad staging sizes %+v: need at least one slot and one reader, slots and pieces whole multiples of %d bytes", c, Align)
	}
	return nil
}

// stagingGPU is what the staging ring asks of the GPU. Only the pack
// goroutine calls it.
type stagingGPU interface {
	// alloc returns n bytes of pinned host memory, the address copies
	// use for it, and the function that frees it.
	alloc(n int) (host []byte, addr uint64, free func() error, err error)
	// queue queues the copies on the copy stream.
	queue(cs []stageCopy) error
	// record records an event after everything queued so far.
	record() (stagingEvent, error)
}

// stagingEvent is a recorded point of the copy stream (*gpu.Event).
type stagingEvent interface {
	Query() (bool, error)
	Close() error
}

// stageCopy is a copy of n bytes from staging (src) to a bucket (dst), or,
// when to is set, a conversion of the n bytes of elements of type from at
// src into elements of type to at dst (on the GPU: see streamStaging).
type stageCopy struct {
	dst, src uint64
	n        int64
	from, to dtype.DType
}

// streamStaging is the stagingGPU of a round: pinned memory of dev, copies
// on stream, queued with one cuMemcpyBatchAsync per slot.
//
// Conversions (stageCopy.to set) go through device scratch memory: the
// source bytes are copied from the slot to the same offset of the slot's
// scratch region, then the cast kernel converts them into the bucket, both
// on stream before the slot's event, so a scratch region is rewritten only
// once its slot is.
type streamStaging struct {
	ctx     context.Context // the round's: bounds waits for the cast kernel's descriptor slots
	dev     *gpu.CUDADevice
	stream  *gpu.Stream
	perCopy bool // queue one cuMemcpyAsync per copy (devicePlan.perCopy)
	batch   gpu.CopyBatch

	// caster and scratch are the deviceFill's (kept across rounds);
	// bases are the addresses of the slots alloc returned, in order: the
	// k-th slot's scratch region is scratch.region(k).
	caster  *gpu.Caster
	scratch *deviceScratch
	bases   []uint64
	slotLen int
}

// deviceScratch is device memory for the source bytes of conversions staged
// from the host: one region per staging slot, allocated at the first
// conversion.
type deviceScratch struct {
	buf    mem.Buffer
	region int64
}

// scratchAt returns the scratch address of staging address src, in the slot
// alloc returned k-th.
func (g *streamStaging) scratchAt(src uint64) (uint64, error) {
	for k, base := range g.bases {
		if src >= base && src < base+uint64(g.slotLen) {
			if g.scratch.buf == nil || g.scratch.region != int64(g.slotLen) || int64(k+1)*g.scratch.region > int64(g.scratch.buf.Len()) {
				if err := g.growScratch(); err != nil {
					return 0, err
				}
			}
			return g.scratch.buf.DevicePtr() + uint64(int64(k)*g.scratch.region) + (src - base), nil
		}
	}
	return 0, fmt.Errorf("pack: staging address %#x outside every slot", src)
}

// growScratch (re)allocates the scratch memory for every slot allocated so
// far, waiting first for the work queued on the stream (which may read
// the old memory).
func (g *streamStaging) growScratch() error {
	if old := g.scratch.buf; old != nil {
		if err := g.stream.Sync(g.ctx); err != nil {
			return fmt.Errorf("pack: waiting to replace the cast scratch memory: %w", err)
		}
		if err := old.Free(); err != nil {
			return err
		}
		g.scratch.buf = nil
	}
	n := max(len(g.bases), StagingBuffers) * g.slotLen
	buf, err := g.dev.Alloc(n)
	if err != nil {
		return fmt.Errorf("pack: allocating %d bytes of device memory to cast host tensors on the GPU: %w", n, err)
	}
	g.scratch.buf, g.scratch.region = buf, int64(g.slotLen)
	return nil
}

func (g *streamStaging) alloc(n int) ([]byte, uint64, func() error, error) {
	b := takeSpare(g.dev, n)
	if b == nil {
		var err error
		if b, err = g.dev.AllocPinned(n); err != nil {
			return nil, 0, nil, fmt.Errorf("pack: allocating %d bytes of pinned staging memory: %w", n, err)
		}
		stagingPinned.Add(1)
	}
	addr, ok := gpu.Address(b)
	if !ok {
		return nil, 0, nil, errors.Join(fmt.Errorf("pack: pinned staging memory of %s has no address", g.dev.Name()), b.Free())
	}
	g.bases = append(g.bases, addr)
	g.slotLen = n
	return b.Host(), addr, func() error { return giveSpare(g.dev, b) }, nil
}

// stagingPinned counts the pinned slots allocated, for tests.
var stagingPinned atomic.Int64

// stagingSpares keeps the pinned slots of finished rounds for the next
// rounds on the same device. Pinning is slow: allocating and freeing a ring
// of 8 × 16 MiB took 85 ms on an H200 host, about as long as packing a
// 4 GiB checkpoint, and a weight sync packs round after round. At most
// StagingBuffers slots are kept per device, those of the latest slot size.
// They are never freed here: like all memory of a device, they go with its
// context, when the last CUDADevice of that GPU is closed (until then a
// closed CUDADevice's entry keeps its slots, and they stay pinned).
var stagingSpares = struct {
	sync.Mutex
	m map[*gpu.CUDADevice][]mem.Buffer
}{m: map[*gpu.CUDADevice][]mem.Buffer{}}

// takeSpare returns a kept slot of n bytes of dev, or nil.
func takeSpare(dev *gpu.CUDADevice, n int) mem.Buffer {
	stagingSpares.Lock()
	defer stagingSpares.Unlock()
	list := stagingSpares.m[dev]
	for i := len(list) - 1; i >= 0; i-- {
		if b := list[i]; b.Len() == n {
			stagingSpares.m[dev] = append(list[:i], list[i+1:]...)
			return b
		}
	}
	return nil
}

// giveSpare keeps b, a slot of dev whose copies have all finished, for a
// later round, or frees it.
func giveSpare(dev *gpu.CUDADevice, b mem.Buffer) error {
	stagingSpares.Lock()
	list := stagingSpares.m[dev]
	var drop mem.Buffer
	switch {
	case len(list) < StagingBuffers:
		stagingSpares.m[dev] = append(list, b)
	default:
		drop = b
		for i, o := range list {
			if o.Len() != b.Len() { // keep the latest size
				list[i], drop = b, o
				break
			}
		}
	}
	stagingSpares.Unlock()
	if drop != nil {
		return drop.Free()
	}
	return nil
}

func (g *streamStaging) queue(cs []stageCopy) error {
	g.batch.Reset()
	casts := 0
	for _, c := range cs {
		if c.to != dtype.Invalid {
			casts++
			continue
		}
		g.batch.Add(c.dst, c.src, c.n)
	}
	g.batch.PerCopy = g.perCopy
	if err := g.stream.CopyBatch(&g.batch); err != nil {
		return err
	}
	if casts == 0 {
		return nil
	}
	for _, c := range cs {
		if c.to == dtype.Invalid {
			continue
		}
		at, err := g.scratchAt(c.src)
		if err != nil {
			return err
		}
		g.batch.Add(at, c.src, c.n)
	}
	if err := g.stream.CopyBatch(&g.batch); err != nil {
		return err
	}
	for _, c := range cs {
		if c.to == dtype.Invalid {
			continue
		}
		at, _ := g.scratchAt(c.src)
		if err := g.caster.Add(c.dst, at, c.n/int64(c.from.Size()), c.from, c.to); err != nil {
			return err
		}
	}
	return g.caster.Flush(g.ctx)
}

func (g *streamStaging) record() (stagingEvent, error) {
	ev, err := g.stream.Record()
	if err != nil {
		return nil, err
	}
	return ev, nil
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
	state  slotState    // used by the pack goroutine only
	ev     stagingEvent // recorded after the slot's copies (slotCopying)
	// pending counts the read jobs not finished, plus one while the slot
	// is being filled; whoever brings it to 0 reports the slot done.
	pending atomic.Int64
}

// readOp reads t's bytes at off into dst.
type readOp struct {
	t   *Tensor
	off int64
	dst []byte
}

// readJob is one piece of work for a reader: reads into one slot.
type readJob struct {
	slot  *stagingSlot
	ops   []readOp
	bytes int64
}

// stager stages host tensors into device buckets for one round (see the
// comment at the top of this file). Its methods are called by the pack
// goroutine only; the reader goroutines touch only the jobs they are given,
// the slots' pending counts, and the first read error.
type stager struct {
	g   stagingGPU
	cfg stagingConfig

	slots []*stagingSlot // allocated as the ring first reaches each
	cur   *stagingSlot   // the slot being filled, nil when none
	next  int            // the slot to fill after cur
	job   readJob        // cur's reads not yet handed to a reader
	nread int            // slots in slotReading

	started bool
	rctx    context.Context // the readers' context: the round's, ended by a read error or stop
	cancel  context.CancelFunc
	jobs    chan readJob      // read jobs; closed by stop, the pack goroutine being its only sender
	done    chan *stagingSlot // slots whose reads finished; never closed; room for every slot, so readers never block on it
	live    atomic.Int32      // readers running
	exited  chan struct{}     // closed by the last reader to return
	closed  bool              // jobs closed

	errMu sync.Mutex
	err   error // the first read error
}

func newStager(g stagingGPU, cfg stagingConfig) (*stager, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	return &stager{g: g, cfg: cfg, slots: make([]*stagingSlot, cfg.slots)}, nil
}

// start starts the readers, under the round's context.
func (s *stager) start(ctx context.Context) {
	s.started = true
	s.rctx, s.cancel = context.WithCancel(ctx)
	s.jobs = make(chan readJob, s.cfg.slots*int(max(1, s.cfg.slotSize/s.cfg.piece)))
	s.done = make(chan *stagingSlot, s.cfg.slots)
	s.exited = make(chan struct{})
	s.live.Store(int32(s.cfg.readers))
	for range s.cfg.readers {
		go s.reader()
	}
}

// reader runs read jobs until jobs is closed. Once the readers' context has
// ended it only accounts for the jobs left, without reading.
func (s *stager) reader() {
	defer func() {
		if s.live.Add(-1) == 0 {
			close(s.exited)
		}
	}()
	for j := range s.jobs {
		for _, op := range j.ops {
			if s.rctx.Err() != nil {
				break
			}
			if err := op.t.ReadAt(op.dst, op.off); err != nil {
				s.fail(err)
				break
			}
		}
		if j.slot.pending.Add(-1) == 0 {
			s.done <- j.slot
		}
	}
}

// fail records the first read error and stops the other readers.
func (s *stager) fail(err error) {
	s.errMu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.errMu.Unlock()
	s.cancel()
}

// readErr returns the first read error, if any.
func (s *stager) readErr() error {
	s.errMu.Lock()
	defer s.errMu.Unlock()
	return s.err
}

// stopped returns why the readers' context ended: a read error, else the
// round's context error.
func (s *stager) stopped(ctx context.Context) error {
	if err := s.readErr(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pack: staging host tensors: %w", err)
	}
	return fmt.Errorf("pack: staging host tensors: %w", context.Cause(s.rctx))
}

// stage lays out t's bytes [off, off+n) for bucket address dst (a device
// address: the bucket's base plus the entry's offset), hands their reads to
// the readers and collects their copies. The copies are queued once the
// reads have finished, at the latest by drain.
func (s *stager) stage(ctx context.Context, t *Tensor, dst uint64, n, off int64) error {
	return s.stageAs(ctx, t, dst, n, off, dtype.Invalid)
}

// stageAs is stage, converting t's elements to the dtype to on the GPU
// when to is set: n and off then count t's (source) bytes, whole elements,
// and dst receives n / t's element size × to's element size bytes. A
// conversion never merges with the copy before it.
func (s *stager) stageAs(ctx context.Context, t *Tensor, dst uint64, n, off int64, to dtype.DType) error {
	if n == 0 {
		return nil
	}
	es, eo := int64(1), int64(1)
	if to != dtype.Invalid {
		es, eo = int64(t.DType.Size()), int64(to.Size())
	}
	if !s.started {
		s.start(ctx)
	}
	if err := s.poll(); err != nil {
		return err
	}
	for done := int64(0); done < n; {
		sl, err := s.current(ctx)
		if err != nil {
			return err
		}
		d := dst + uint64(done/es*eo)
		pos, grow := alignUp(sl.fill), false
		// Mirror the bucket's alignment padding, so that consecutive
		// small tensors become one copy (the last copy of the slot ends
		// at fill).
		if k := len(sl.copies) - 1; k >= 0 && to == dtype.Invalid && sl.copies[k].to == dtype.Invalid {
			if end := sl.copies[k].dst + uint64(sl.copies[k].n); d >= end && d-end < Align {
				pos, grow = sl.fill+int64(d-end), true
			}
		}
		if pos >= s.cfg.slotSize {
			if err := s.seal(ctx); err != nil {
				return err
			}
			continue
		}
		m := min(n-done, s.cfg.slotSize-pos) // whole elements: both are multiples of Align
		switch {
		case grow:
			sl.copies[len(sl.copies)-1].n += pos - sl.fill + m
		case to != dtype.Invalid:
			sl.copies = append(sl.copies, stageCopy{dst: d, src: sl.addr + uint64(pos), n: m, from: t.DType, to: to})
		default:
			sl.copies = append(sl.copies, stageCopy{dst: d, src: sl.addr + uint64(pos), n: m})
		}
		if err := s.read(ctx, t, off+done, sl.host[pos:pos+m]); err != nil {
			return err
		}
		sl.fill = pos + m
		done += m
		if sl.fill == s.cfg.slotSize {
			if err := s.seal(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// read adds the reads of t's bytes at off into dst (in the current slot) to
// the open job, handing jobs to the readers as they fill. Jobs are split on
// Align boundaries of the tensor, so every read starts on an element.
func (s *stager) read(ctx context.Context, t *Tensor, off int64, dst []byte) error {
	for len(dst) > 0 {
		k := int64(len(dst))
		if room := s.cfg.piece - s.job.bytes; k > room {
			k = room &^ (Align - 1)
		}
		if k == 0 {
			if err := s.dispatch(ctx); err != nil {
				return err
			}
			continue
		}
		s.job.ops = append(s.job.ops, readOp{t: t, off: off, dst: dst[:k:k]})
		s.job.bytes += k
		off, dst = off+k, dst[k:]
		if s.job.bytes >= s.cfg.piece || len(s.job.ops) >= stagingMaxOps {
			if err := s.dispatch(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// dispatch hands the open job to the readers.
func (s *stager) dispatch(ctx context.Context) error {
	j := s.job
	s.job = readJob{slot: j.slot}
	if len(j.ops) == 0 {
		return nil
	}
	j.slot.pending.Add(1)
	select {
	case s.jobs <- j:
		return nil
	case <-s.rctx.Done():
		return s.stopped(ctx)
	}
}

// current returns the slot being filled, starting the next one of the ring
// (allocating it the first time, else waiting until it is free) if none is.
func (s *stager) current(ctx context.Context) (*stagingSlot, error) {
	if s.cur != nil {
		return s.cur, nil
	}
	sl := s.slots[s.next]
	if sl == nil {
		host, addr, free, err := s.g.alloc(int(s.cfg.slotSize))
		if err != nil {
			return nil, err
		}
		sl = &stagingSlot{host: host, addr: addr, free: free}
		s.slots[s.next] = sl
	} else if err := s.await(ctx, sl); err != nil {
		return nil, err
	}
	s.next = (s.next + 1) % len(s.slots)
	sl.copies = sl.copies[:0]
	sl.fill, sl.state = 0, slotFilling
	sl.pending.Store(1)
	s.cur, s.job = sl, readJob{slot: sl}
	return sl, nil
}

// seal ends the filling of the current slot: its last job goes to the
// readers, and its copies are queued at once if its reads are done already.
func (s *stager) seal(ctx context.Context) error {
	sl := s.cur
	if sl == nil {
		return nil
	}
	if err := s.dispatch(ctx); err != nil {
		return err
	}
	s.cur = nil
	sl.state = slotReading
	s.nread++
	if sl.pending.Add(-1) == 0 {
		return s.queue(sl)
	}
	return nil
}

// queue queues the copies out of sl, whose reads have all finished, and
// records the event after which it may be refilled. After a read error it
// queues nothing: the round fails.
func (s *stager) queue(sl *stagingSlot) error {
	if err := s.readErr(); err != nil {
		return err
	}
	s.nread--
	if len(sl.copies) > 0 {
		if err := s.g.queue(sl.copies); err != nil {
			return fmt.Errorf("pack: queueing copies from pinned staging into a device bucket: %w", err)
		}
	}
	ev, err := s.g.record()
	if err != nil {
		return fmt.Errorf("pack: recording a staging event: %w", err)
	}
	sl.ev, sl.state = ev, slotCopying
	return nil
}

// poll queues the copies of every slot whose reads have finished, without
// waiting, and reports a read error.
func (s *stager) poll() error {
	if err := s.readErr(); err != nil {
		return err
	}
	for {
		select {
		case sl := <-s.done:
			if err := s.queue(sl); err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// awaitReads waits until the reads of some slot finish and queues its
// copies.
func (s *stager) awaitReads(ctx context.Context) error {
	select {
	case sl := <-s.done:
		return s.queue(sl)
	case <-s.rctx.Done():
		// A read error, or the round ended; prefer a completion that
		// raced with it only if there is no error to report.
		return s.stopped(ctx)
	}
}

// await waits until sl is free: its reads finished, its copies queued and
// completed. Meanwhile it queues the copies of other slots as their reads
// finish.
func (s *stager) await(ctx context.Context, sl *stagingSlot) error {
	for {
		switch sl.state {
		case slotFree:
			return nil
		case slotReading:
			if err := s.awaitReads(ctx); err != nil {
				return err
			}
		case slotCopying:
			err := gpu.Poll(s.rctx, func() (bool, error) {
				if err := s.poll(); err != nil {
					return false, err
				}
				return sl.ev.Query()
			})
			if err != nil {
				if s.rctx.Err() != nil {
					return s.stopped(ctx)
				}
				return fmt.Errorf("pack: waiting for a staging buffer to drain: %w", err)
			}
			ev := sl.ev
			sl.ev, sl.state = nil, slotFree
			if err := ev.Close(); err != nil {
				return fmt.Errorf("pack: destroying a staging event: %w", err)
			}
		default:
			return fmt.Errorf("pack: staging slot in state %d cannot be reused", sl.state)
		}
	}
}

// drain seals the current slot and waits until every read so far has
// finished and its copies are queued: after drain, an event recorded on the
// copy stream follows every staged copy. It does not wait for the copies.
func (s *stager) drain(ctx context.Context) error {
	if s == nil || !s.started {
		return nil
	}
	if err := s.seal(ctx); err != nil {
		return err
	}
	if err := s.poll(); err != nil {
		return err
	}
	for s.nread > 0 {
		if err := s.awaitReads(ctx); err != nil {
			return err
		}
	}
	return nil
}

// stop ends the readers and waits until they have returned, bounded by ctx
// or, once ctx is done, by finalWait. Reads in progress finish (a read
// cannot be interrupted); jobs not started are dropped.
func (s *stager) stop(ctx context.Context) error {
	if s == nil || !s.started {
		return nil
	}
	s.cancel()
	if !s.closed {
		s.closed = true
		close(s.jobs)
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), finalWait)
		defer cancel()
	}
	select {
	case <-s.exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("pack: %d staging readers still reading after the round; leaving the staging memory allocated: %w", s.live.Load(), ctx.Err())
	}
}

// free frees the slots and their events. Call it only once the readers have
// stopped and every copy queued on the stream has finished.
func (s *stager) free() error {
	if s == nil {
		return nil
	}
	if s.started {
		select {
		case <-s.exited:
		default:
			return errors.New("pack: staging readers still running; leaving the staging memory allocated")
		}
	}
	var errs []error
	for i, sl := range s.slots {
		if sl == nil {
			continue
		}
		if sl.ev != nil {
			errs = append(errs, sl.ev.Close())
		}
		errs = append(errs, sl.free())
		s.slots[i] = nil
	}
	return errors.Join(errs...)
}
