package gpu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
)

// These test the staging ring without a GPU: fakeStaging stands in for the
// stream. It runs queued copies late, at random points (on later
// calls and on event queries), reading the staging memory only then, as
// the copy engine does; so a slot refilled before its event completed, or
// copies queued before the reads into their slot finished, show up as
// wrong bytes (and as data races under -race).

// fakeStaging is a copy stream over fake memory regions.
type fakeStaging struct {
	rng     *rand.Rand
	regions map[uint64][]byte // base address → bytes
	nextA   uint64
	ops     []fakeOp // queued in order; ran[:done] have run
	done    int
	hold    bool // events never complete and copies never run

	allocs, frees, copies int
}

// fakeOp is a queued copy or conversion (to set), or an event (ev != nil).
type fakeOp struct {
	dst, src uint64
	n        int64
	from, to dtype.DType
	ev       *fakeEvent
}

type fakeEvent struct {
	f      *fakeStaging
	at     int // index of the op
	closed bool
}

func newFakeStaging(seed uint64) *fakeStaging {
	return &fakeStaging{rng: rand.New(rand.NewPCG(seed, 99)), regions: map[uint64][]byte{}, nextA: 1 << 40}
}

// region adds n bytes of fake memory (a bucket) and returns its address.
func (f *fakeStaging) region(n int) uint64 {
	a := f.nextA
	f.nextA += 1 << 32
	f.regions[a] = make([]byte, n)
	return a
}

// resolve returns the n bytes at addr, which must lie in one region.
func (f *fakeStaging) resolve(addr uint64, n int64) ([]byte, error) {
	for base, b := range f.regions {
		if addr >= base && addr+uint64(n) <= base+uint64(len(b)) {
			return b[addr-base : addr-base+uint64(n)], nil
		}
	}
	return nil, fmt.Errorf("copy of %d bytes at %#x outside every allocation (freed, or spanning two)", n, addr)
}

func (f *fakeStaging) alloc(n int) ([]byte, uint64, func() error, error) {
	a := f.region(n)
	f.allocs++
	return f.regions[a], a, func() error {
		if _, ok := f.regions[a]; !ok {
			return errors.New("freed twice")
		}
		delete(f.regions, a)
		f.frees++
		return nil
	}, nil
}

func (f *fakeStaging) queue(_ context.Context, cs []stageCopy) error {
	for _, c := range cs {
		f.ops = append(f.ops, fakeOp{dst: c.dst, src: c.src, n: c.n, from: c.from, to: c.to})
		f.copies++
	}
	return f.progress()
}

func (f *fakeStaging) record() (stagingEvent, error) {
	e := &fakeEvent{f: f, at: len(f.ops)}
	f.ops = append(f.ops, fakeOp{ev: e})
	f.progress()
	return e, nil
}

// progress runs a random number of queued ops, as a GPU that is somewhat
// behind.
func (f *fakeStaging) progress() error {
	if f.hold {
		return nil
	}
	return f.runTo(f.done + f.rng.IntN(3))
}

// runTo runs the ops before index i.
func (f *fakeStaging) runTo(i int) error {
	for ; f.done < min(i, len(f.ops)); f.done++ {
		op := f.ops[f.done]
		if op.ev != nil {
			continue
		}
		src, err := f.resolve(op.src, op.n)
		if err != nil {
			return err
		}
		if op.to != dtype.Invalid {
			dst, err := f.resolve(op.dst, op.n/int64(op.from.Size())*int64(op.to.Size()))
			if err != nil {
				return err
			}
			if err := cast.Convert(dst, op.to, src, op.from); err != nil {
				return err
			}
			continue
		}
		dst, err := f.resolve(op.dst, op.n)
		if err != nil {
			return err
		}
		copy(dst, src)
	}
	return nil
}

func (f *fakeStaging) sync(context.Context) error {
	f.hold = false
	return f.runTo(len(f.ops))
}

func (f *fakeStaging) close(context.Context) error { return nil }

func (e *fakeEvent) Query() (bool, error) {
	if e.closed {
		return false, errors.New("event used after Close")
	}
	if err := e.f.progress(); err != nil {
		return false, err
	}
	return e.f.done > e.at, nil
}

func (e *fakeEvent) Close() error {
	if e.closed {
		return errors.New("event closed twice")
	}
	e.closed = true
	return nil
}

// fakeRound stages sources as stages' Pack lays tensors out in buckets of
// bsize bytes of fake device memory, and drains and records each bucket's
// ready event as Pack does when a bucket is full.
type fakeRound struct {
	fk      *fakeStaging
	s       *StagingRing
	bsize   int64
	buckets []*fakeBucket
	cur     *fakeBucket
}

type fakeBucket struct {
	addr    uint64
	fill    int64
	entries []fakeEntry
	ready   int // index of the ready event among the stream's ops
}

type fakeEntry struct {
	off  int64
	data []byte // the bytes expected there
}

func newFakeRound(t *testing.T, seed uint64, cfg StagingConfig, bsize int64) *fakeRound {
	t.Helper()
	fk := newFakeStaging(seed)
	s, err := newStagingRing(fk, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fakeRound{fk: fk, s: s, bsize: bsize}
}

func (r *fakeRound) finish(ctx context.Context) error {
	if r.cur == nil {
		return nil
	}
	if err := r.s.Drain(ctx); err != nil {
		return err
	}
	ev, err := r.fk.record()
	if err != nil {
		return err
	}
	r.cur.ready = ev.(*fakeEvent).at
	r.cur = nil
	return nil
}

// add stages src, whose bytes are want, as stages' Pack lays a tensor out.
func (r *fakeRound) add(ctx context.Context, src StagingSource, want []byte) error {
	return r.addAs(ctx, src, dtype.Invalid, dtype.Invalid, want)
}

// addAs is add converting src's elements of dtype from to the dtype to on
// the "GPU" when to is set; want is then the converted bytes.
func (r *fakeRound) addAs(ctx context.Context, src StagingSource, from, to dtype.DType, want []byte) error {
	es, eo := int64(1), int64(1)
	if to != dtype.Invalid {
		es, eo = int64(from.Size()), int64(to.Size())
	}
	size := int64(len(want))
	if r.cur != nil && len(r.cur.entries) > 0 && size <= r.bsize && alignUp(r.cur.fill)+size > r.bsize {
		if err := r.finish(ctx); err != nil {
			return err
		}
	}
	for chunk := int64(0); chunk < size; {
		if r.cur == nil {
			r.cur = &fakeBucket{addr: r.fk.region(int(r.bsize))}
			r.buckets = append(r.buckets, r.cur)
		}
		off := alignUp(r.cur.fill)
		n := min(size-chunk, r.bsize-off)
		if n < size-chunk {
			n &^= StagingAlign - 1
		}
		if n <= 0 {
			if err := r.finish(ctx); err != nil {
				return err
			}
			continue
		}
		var err error
		if to != dtype.Invalid {
			err = r.s.Convert(ctx, src, from, to, r.cur.addr+uint64(off), n/eo*es, chunk/eo*es)
		} else {
			err = r.s.Copy(ctx, src, r.cur.addr+uint64(off), n, chunk)
		}
		if err != nil {
			return err
		}
		r.cur.entries = append(r.cur.entries, fakeEntry{off: off, data: want[chunk : chunk+n]})
		r.cur.fill = off + n
		chunk += n
	}
	return nil
}

// close ends the ring: stop the readers, let every copy run, free.
func (r *fakeRound) close(t *testing.T) {
	t.Helper()
	if err := r.s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r.fk.frees != r.fk.allocs {
		t.Fatalf("%d staging slots allocated, %d freed", r.fk.allocs, r.fk.frees)
	}
}

// check verifies that every copy into a bucket was queued before the
// bucket's ready event, and every entry's bytes (after close ran them).
func (r *fakeRound) check(t *testing.T) {
	t.Helper()
	for i, op := range r.fk.ops {
		if op.ev != nil {
			continue
		}
		for k, b := range r.buckets {
			if op.dst >= b.addr && op.dst < b.addr+uint64(r.bsize) && i > b.ready {
				t.Fatalf("a copy into bucket %d was queued after its ready event", k)
			}
		}
	}
	for k, b := range r.buckets {
		mem := r.fk.regions[b.addr]
		for _, e := range b.entries {
			if i := diffAt(mem[e.off:e.off+int64(len(e.data))], e.data); i >= 0 {
				t.Fatalf("bucket %d, entry at %d (%d bytes): byte %d differs", k, e.off, len(e.data), i)
			}
		}
	}
}

// source is a StagingSource over r called name, which fails short reads
// and names itself in its errors, as a stages.Tensor does.
type source struct {
	name string
	r    io.ReaderAt
}

func (s source) ReadAt(p []byte, off int64) error {
	n, err := s.r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("tensor %q: reading %d bytes at %d: %w", s.name, len(p), off, err)
}

// bytesSource is a source over data.
func bytesSource(name string, data []byte) source { return source{name, bytes.NewReader(data)} }

// alignedReader fails a read that does not start on a StagingAlign
// boundary of the source (a cast reader needs whole elements).
type alignedReader struct{ r io.ReaderAt }

func (a alignedReader) ReadAt(p []byte, off int64) (int, error) {
	if off%StagingAlign != 0 {
		return 0, fmt.Errorf("read at %d, not on a %d-byte boundary", off, StagingAlign)
	}
	return a.r.ReadAt(p, off)
}

// TestStagingBytes stages random tensors, in memory and behind readers,
// through rings of several shapes, and checks every bucket byte for byte.
// The fake stream runs copies late, so a slot refilled too early or copies
// queued before their reads finished give wrong bytes.
func TestStagingBytes(t *testing.T) {
	for i, cfg := range []StagingConfig{
		{Slots: 1, SlotSize: 256, Piece: 64, Readers: 1},
		{Slots: 2, SlotSize: 1024, Piece: 128, Readers: 3},
		{Slots: 4, SlotSize: 4096, Piece: 512, Readers: 4},
		{Slots: 3, SlotSize: 640, Piece: 640, Readers: 2},
	} {
		t.Run(fmt.Sprintf("%d×%d,piece=%d,readers=%d", cfg.Slots, cfg.SlotSize, cfg.Piece, cfg.Readers), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			r := newFakeRound(t, uint64(i), cfg, 3000)
			ctx := context.Background()
			for k := range 300 {
				size := []int{rng.IntN(100), rng.IntN(1000), rng.IntN(9000)}[rng.IntN(3)]
				data := make([]byte, size)
				for j := range data {
					data[j] = byte(rng.Uint32())
				}
				src := bytesSource(fmt.Sprintf("t%d", k), data)
				if k%2 != 0 {
					src.r = alignedReader{bytes.NewReader(data)}
				}
				if err := r.add(ctx, src, data); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.finish(ctx); err != nil {
				t.Fatal(err)
			}
			r.close(t)
			r.check(t)
			if r.fk.allocs > cfg.Slots || r.s.Pinned() != r.fk.allocs {
				t.Fatalf("%d slots allocated (Pinned says %d) for a ring of %d", r.fk.allocs, r.s.Pinned(), cfg.Slots)
			}
			t.Logf("%d buckets, %d copies", len(r.buckets), r.fk.copies)
		})
	}
}

// TestStagingCasts stages tensors converted on the "GPU" (F32 → BF16 and
// F16, BF16 ↔ F16, widening to F32) among plain ones, some larger than a
// slot or a bucket: the staged source bytes, laid out in whole elements,
// convert into exactly what cast.Convert gives, and a conversion never
// merges with its neighbours.
func TestStagingCasts(t *testing.T) {
	pairs := [][2]dtype.DType{{dtype.F32, dtype.BF16}, {dtype.F32, dtype.F16}, {dtype.BF16, dtype.F16}, {dtype.F16, dtype.BF16}, {dtype.BF16, dtype.F32}, {dtype.F16, dtype.F32}}
	for i, cfg := range []StagingConfig{
		{Slots: 2, SlotSize: 1024, Piece: 128, Readers: 3},
		{Slots: 4, SlotSize: 4096, Piece: 512, Readers: 4},
	} {
		t.Run(fmt.Sprintf("%d×%d", cfg.Slots, cfg.SlotSize), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			r := newFakeRound(t, uint64(i), cfg, 3008)
			ctx := context.Background()
			for k := range 200 {
				elems := []int{rng.IntN(30), rng.IntN(400), rng.IntN(3000)}[rng.IntN(3)]
				if k%3 == 0 {
					data := make([]byte, elems)
					for j := range data {
						data[j] = byte(rng.Uint32())
					}
					if err := r.add(ctx, bytesSource(fmt.Sprintf("plain%d", k), data), data); err != nil {
						t.Fatal(err)
					}
					continue
				}
				p := pairs[rng.IntN(len(pairs))]
				src := make([]byte, elems*p[0].Size())
				for j := range src {
					src[j] = byte(rng.Uint32())
				}
				want := make([]byte, elems*p[1].Size())
				if err := cast.Convert(want, p[1], src, p[0]); err != nil {
					t.Fatal(err)
				}
				// A widening cast's chunks start on elements, not on
				// StagingAlign boundaries of the source.
				if err := r.addAs(ctx, bytesSource(fmt.Sprintf("cast%d", k), src), p[0], p[1], want); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.finish(ctx); err != nil {
				t.Fatal(err)
			}
			r.close(t)
			r.check(t)
			for _, op := range r.fk.ops {
				if op.to != dtype.Invalid && op.n%int64(op.from.Size()) != 0 {
					t.Fatalf("a conversion of %d bytes of %s: not whole elements", op.n, op.from)
				}
			}
		})
	}
}

// TestStagingMerges: consecutive small tensors of one bucket become one
// copy, across the alignment padding; a new bucket starts a new copy, in
// the next slot; slots are allocated as the ring reaches them.
func TestStagingMerges(t *testing.T) {
	r := newFakeRound(t, 1, StagingConfig{Slots: 2, SlotSize: 64 << 10, Piece: 4 << 10, Readers: 2}, 16<<10)
	ctx := context.Background()
	data := bytes.Repeat([]byte{1, 2, 3, 4, 5}, 20) // 100 bytes: 28 of padding after each
	for k := range 200 {                            // 128 per bucket
		if err := r.add(ctx, bytesSource(fmt.Sprintf("t%d", k), data), data); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.finish(ctx); err != nil {
		t.Fatal(err)
	}
	r.close(t)
	r.check(t)
	if len(r.buckets) != 2 || r.fk.copies != 2 {
		t.Fatalf("%d buckets in %d copies; want 2 in 2", len(r.buckets), r.fk.copies)
	}
	if r.fk.allocs != 2 {
		t.Fatalf("%d slots allocated for two buckets of 16 KiB; want 2 (a bucket's end seals its slot)", r.fk.allocs)
	}
}

// barrierReader serves data, holding every read until need reads are in
// progress at once (or failing after a while): it proves that one tensor
// is read by several goroutines together. It records each read.
type barrierReader struct {
	data []byte
	need int32

	in      atomic.Int32
	arrived chan struct{} // closed when need reads are in progress
	once    sync.Once
	mu      sync.Mutex
	reads   [][2]int64 // off, len
}

func (b *barrierReader) ReadAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	b.reads = append(b.reads, [2]int64{off, int64(len(p))})
	b.mu.Unlock()
	if b.in.Add(1) >= b.need {
		b.once.Do(func() { close(b.arrived) })
	}
	select {
	case <-b.arrived:
	case <-time.After(10 * time.Second):
		return 0, fmt.Errorf("only %d of %d reads in parallel", b.in.Load(), b.need)
	}
	return copy(p, b.data[off:]), nil
}

// TestStagingPieces: a tensor of 8 pieces is read in pieces, by 4
// goroutines at once, each read on a piece boundary.
func TestStagingPieces(t *testing.T) {
	cfg := StagingConfig{Slots: 2, SlotSize: 4096, Piece: 512, Readers: 4}
	r := newFakeRound(t, 2, cfg, 1<<20)
	data := make([]byte, 4096)
	for i := range data {
		data[i] = byte(i * 7)
	}
	br := &barrierReader{data: data, need: 4, arrived: make(chan struct{})}
	ctx := context.Background()
	if err := r.add(ctx, source{"big", br}, data); err != nil {
		t.Fatal(err)
	}
	if err := r.finish(ctx); err != nil {
		t.Fatal(err)
	}
	r.close(t)
	r.check(t)
	if len(br.reads) != 8 {
		t.Fatalf("%d reads; want 8 of 512 bytes", len(br.reads))
	}
	for _, rd := range br.reads {
		if rd[0]%512 != 0 || rd[1] != 512 {
			t.Fatalf("read of %d bytes at %d; want 512 on a 512-byte boundary", rd[1], rd[0])
		}
	}
	if r.fk.copies != 1 {
		t.Fatalf("%d copies for one slot of one tensor", r.fk.copies)
	}
}

// failReader fails reads that reach byte at.
type failReader struct {
	data []byte
	at   int64
}

var errDiskOnFire = errors.New("disk on fire")

func (f failReader) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > f.at {
		return 0, errDiskOnFire
	}
	return copy(p, f.data[off:]), nil
}

// TestStagingReadError: a failed read fails the round with the tensor
// named, the readers stop, and everything is freed.
func TestStagingReadError(t *testing.T) {
	r := newFakeRound(t, 3, StagingConfig{Slots: 2, SlotSize: 1024, Piece: 128, Readers: 3}, 4096)
	ctx := context.Background()
	data := make([]byte, 3000)
	var err error
	for k := 0; k < 40 && err == nil; k++ {
		src := bytesSource(fmt.Sprintf("t%d", k), data)
		if k == 5 {
			src = source{"bad.weight", failReader{data: data, at: 1500}}
		}
		err = r.add(ctx, src, data)
	}
	if err == nil {
		err = r.finish(ctx)
	}
	if !errors.Is(err, errDiskOnFire) || !strings.Contains(err.Error(), `"bad.weight"`) {
		t.Fatalf("round with a failing read: %v; want the read error naming bad.weight", err)
	}
	r.close(t)
}

// blockReader blocks every read until release is closed, and counts them.
type blockReader struct {
	started chan struct{} // gets a value when a read starts
	release chan struct{}
	reads   atomic.Int32
}

func (b *blockReader) ReadAt(p []byte, off int64) (int, error) {
	b.reads.Add(1)
	select {
	case b.started <- struct{}{}:
	default:
	}
	<-b.release
	return len(p), nil
}

// TestStagingCancel: cancelling the round ends the waits at once, and the
// readers start no new read after it.
func TestStagingCancel(t *testing.T) {
	r := newFakeRound(t, 4, StagingConfig{Slots: 2, SlotSize: 4096, Piece: 512, Readers: 1}, 1<<20)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	br := &blockReader{started: make(chan struct{}, 1), release: make(chan struct{})}
	if err := r.add(ctx, source{"w", br}, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	<-br.started
	go func() {
		time.Sleep(20 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	err := r.finish(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("drain after cancel: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("drain took %v to see the cancel", d)
	}
	close(br.release)
	r.close(t)
	if n := br.reads.Load(); n != 1 {
		t.Fatalf("%d reads; the 7 left after the cancel should not have started", n)
	}
}

// TestStagingStopBounded: Stop gives up on a stuck reader when its context
// ends, and Close then refuses to free the memory the reader writes.
func TestStagingStopBounded(t *testing.T) {
	r := newFakeRound(t, 5, StagingConfig{Slots: 2, SlotSize: 4096, Piece: 512, Readers: 2}, 1<<20)
	br := &blockReader{started: make(chan struct{}, 1), release: make(chan struct{})}
	if err := r.add(context.Background(), source{"w", br}, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	<-br.started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.s.Stop(ctx); err == nil || !strings.Contains(err.Error(), "still reading") {
		t.Fatalf("Stop with a stuck reader: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := r.s.Close(ctx); err == nil {
		t.Fatal("Close with a reader still running succeeded")
	}
	if r.fk.frees != 0 {
		t.Fatal("memory freed under a running reader")
	}
	close(br.release)
	r.close(t)
}

// TestStagingWaitsForCopies: with the copy stream stalled, the ring does
// not refill a slot whose copies have not run, the wait ends with the
// round's context, and meanwhile the copies of the other slot are queued as
// soon as its reads finish.
func TestStagingWaitsForCopies(t *testing.T) {
	r := newFakeRound(t, 6, StagingConfig{Slots: 2, SlotSize: 1024, Piece: 256, Readers: 2}, 1<<20)
	r.fk.hold = true
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	data := make([]byte, 2048+64)
	err := r.add(ctx, bytesSource("w", data), data) // two full slots, then waits for the first
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("staging a third slot with the stream stalled: %v", err)
	}
	if r.fk.copies != 2 {
		t.Fatalf("%d copies queued; want both slots' copies queued while waiting", r.fk.copies)
	}
	if r.fk.done != 0 {
		t.Fatal("the stalled stream ran")
	}
	r.close(t)
}

func TestStagingConfig(t *testing.T) {
	for _, c := range []StagingConfig{
		{Slots: 0, SlotSize: 64, Piece: 64, Readers: 1},
		{Slots: 1, SlotSize: 100, Piece: 64, Readers: 1},
		{Slots: 1, SlotSize: 64, Piece: 32, Readers: 1},
		{Slots: 1, SlotSize: 64, Piece: 64, Readers: 0},
	} {
		if _, err := newStagingRing(nil, c); err == nil {
			t.Errorf("newStagingRing(%+v) succeeded", c)
		}
	}
	if _, err := newStagingRing(nil, DefaultStagingConfig()); err != nil {
		t.Fatal(err)
	}
}
