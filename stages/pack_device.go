package stages

// deviceFill, the filler of device buckets (a Pool of device memory), fills
// them on the GPU through a copy stream that a Packer keeps from round to
// round (with the kernels' memory):
//
//   - device tensors (Tensor.Device) are copied device to device: those
//     on the bucket's GPU, in copies shorter than the plan's gatherBelow,
//     by the gather kernel (gpu.Gather: one launch copies thousands of
//     ranges, where the copy engine costs microseconds per copy), the
//     others by the copy engine, the large ones spread over the plan's
//     lanes (more streams, joined back before the bucket's event);
//   - tensors that cast are converted into the bucket by the GPU cast
//     kernel (gpu.Caster), on the copy stream: device tensors straight
//     from their memory, host tensors from their source bytes, staged as
//     below and copied to device scratch memory first;
//   - device weights that Quantize picked are quantized by the GPU
//     quantize kernel (gpu.Quantizer), on the copy stream: each chunk of
//     codes straight into its bucket, the scales of the blocks it touches
//     into device scratch memory, copied into the bucket as the scale
//     tensor (quantIn); host weights are quantized on the CPU as they are
//     read (Tensor.ReadAt), and staged as below;
//   - host tensors (Data or Reader) are read, by several goroutines in
//     parallel, into a ring of pinned staging slots (gpu.StagingRing) and
//     copied host to device from there, so that the copy runs at pinned
//     speed while the next bytes are read;
//   - copies are not issued one per tensor: they are collected in two
//     gpu.CopyBatch queues, one for the gather kernel and one for the copy
//     engine (queued with one cuMemcpyBatchAsync per batch, or per-copy
//     cuMemcpyAsync where the driver lacks it or the plan says so). Copies
//     that continue each other, including across the alignment padding
//     between tensors of one buffer, merge into one.
//
// Where the gather kernel cannot be loaded (gpu.NewGather says why, and
// gpu.LastGatherPath tells which path ran), its queue goes to the copy
// engine too.
//
// When a bucket is full, an event is recorded after its copies and the
// bucket's buffer travels fenced (gpu.WithFence): the transport orders its
// broadcast after the event on the GPU (cuStreamWaitEvent on the NCCL
// stream) or waits for it on the host (CUDA IPC) — pack never blocks on
// its own copies. The event is destroyed when the bucket is released. With
// PackConfig.Checksum, the checksum costs no pass of its own where the
// fused kernel can be used: every device copy on the bucket's GPU goes
// through it (gpu.Gather.CopySum, summing each word as it copies it and
// reading the bytes other copies wrote where they lie), the copy engine
// left to rounds without checksums. Elsewhere the bucket's checksum is
// queued on the GPU right after the event (gpu.Checksummer). Publish waits
// for it. Where the checksum kernel is unavailable, pack copies the bucket
// back to the host (gpu.Readback) and sums it there: slower, never
// skipped.
//
// When the round is traced, each device bucket's copies are bracketed by
// a pair of timed events on the copy stream, read after the round: the
// host's pack span then shows only the time to queue the work ("bucket k
// (queued)", with no byte count, so no rate), and Sender.Sync adds the
// GPU's time on a lane of its own, "pack (GPU)".

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/wire"
)

// flushEvery bounds the copies collected in one queue before they are
// handed to the driver, so that the GPU starts on a bucket of many small
// tensors early.
const flushEvery = 4096

// devicePlan says how pack queues the copies of device tensors.
type devicePlan struct {
	// gatherBelow: copies shorter than this, out of device memory of the
	// bucket's GPU, go through the gather kernel; 0 turns it off.
	gatherBelow int64
	// perCopy queues the copy engine's copies one cuMemcpyAsync each
	// instead of with cuMemcpyBatchAsync.
	perCopy bool
	// lanes is the number of streams the copy engine's device-to-device
	// copies of at least laneAbove bytes are spread over, in turn: the
	// copy stream and lanes-1 more, joined back into the copy stream
	// before the bucket's ready event, so that one copy's ramp-up and
	// drain overlap another's. 0 or 1: the copy stream alone.
	lanes     int
	laneAbove int64
	// hostCast converts host tensors that cast on the host, as they are
	// read, even where the GPU cast kernel could (to compare the two).
	hostCast bool
}

// defaultPlan is the plan a Packer uses: device-to-device copies under
// 16 MiB through the gather kernel, larger ones on the copy engine, spread
// over four streams (the measurements behind it are in
// docs/benchmarks.md, "Figures behind the GPU defaults", the device copy
// plan).
var defaultPlan = devicePlan{gatherBelow: 16 << 20, lanes: 4, laneAbove: 16 << 20}

// finalWait bounds the wait for a round's copies when the round's own
// context is already done (so that memory is never freed under a copy).
const finalWait = time.Minute

// bounded returns ctx, or, once ctx is done, a context of finalWait that
// keeps its values.
func bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), finalWait)
}

// deviceFill queues the copies that fill device buckets, round after round.
// It is used by one pack goroutine at a time.
type deviceFill struct {
	stream  *gpu.Stream // the copy stream, of the buckets' GPU
	plan    devicePlan
	staging gpu.StagingConfig
	// batch is the copy engine's queue: host staging copies and the
	// device copies that do not go to the kernel. lastSrc is the address
	// of the buffer the batch's last copy reads from (0: none), so that a
	// copy continuing it across alignment padding can merge.
	batch   gpu.CopyBatch
	lastSrc uint64

	// gather takes device copies shorter than plan.gatherBelow out of
	// memory of the bucket's GPU (none when it is 0), and sums direct
	// buckets: kbatch is its queue, klastSrc as lastSrc. With fuse (a round with checksums, the
	// fused kernel usable: beginRound), it takes every device copy on the
	// bucket's GPU, and kbatch holds the whole bucket's until finishFused
	// queues them with the checksum.
	gather   *gpu.Gather
	kbatch   gpu.CopyBatch
	klastSrc uint64
	fuse     bool

	// caster converts device tensors that cast into the bucket (the GPU
	// cast kernel), made at the first such tensor.
	caster *gpu.Caster

	// quantizer quantizes device weights into the buckets (the GPU
	// quantize kernel, see quantIn), made at the first. qscales is device
	// memory that holds the scales of qw, the weight being quantized,
	// which its scale tensor is copied from; qcoded counts the elements of
	// qw whose codes were queued; qspent holds scratch memory outgrown,
	// freed once the copies have settled.
	quantizer *gpu.Quantizer
	qscales   mem.Buffer
	qspent    []mem.Buffer
	qw        *quantized
	qcoded    int64

	// sums computes bucket checksums on the copy stream, made at the
	// first; sumsWhy says why the kernel is unavailable, and readback
	// then copies buckets to the host to sum them there.
	sums     *gpu.Checksummer
	sumsWhy  error
	readback *gpu.Readback

	// macs computes bucket MACs on a stream of its own (mac.go);
	// layoutMACs those of direct buckets, on the copy stream.
	macs       deviceMAC
	layoutMACs streamMACer

	// lanes are the extra streams of plan.lanes, with a queue each;
	// laneUsed marks those with copies into the current bucket, next is
	// the stream (0: the copy stream, i: lanes[i-1]) of the next large
	// copy.
	lanes     []*gpu.Stream
	laneBatch []gpu.CopyBatch
	laneUsed  []bool
	next      int

	// ring stages host tensors, made at the first one; its slots stay
	// pinned from round to round.
	ring *gpu.StagingRing

	// marks are the timed events around each bucket of a traced round.
	marks gpuMarks
}

func newDeviceFill(dev *gpu.CUDADevice, plan devicePlan, staging gpu.StagingConfig) (*deviceFill, error) {
	s, err := dev.NewStream()
	if err != nil {
		return nil, fmt.Errorf("pack: creating the copy stream: %w", err)
	}
	f := &deviceFill{stream: s, plan: plan, staging: staging, marks: gpuMarks{stage: "pack"}}
	for range f.plan.lanes - 1 {
		ls, err := dev.NewStream()
		if err != nil {
			f.close(context.Background())
			return nil, fmt.Errorf("pack: creating a copy lane: %w", err)
		}
		f.lanes = append(f.lanes, ls)
	}
	f.laneBatch = make([]gpu.CopyBatch, len(f.lanes))
	f.laneUsed = make([]bool, len(f.lanes))
	f.gather = s.NewGather() // the plan's copies use it only when gatherBelow is set
	return f, nil
}

// merge appends a copy of n bytes from src (inside the buffer at srcBase)
// to dst to b, or merges it into b's last copy when it continues that
// copy, on both sides, across at most the alignment padding, in the same
// source buffer (*last; the destination is always the current bucket).
// Copies from different buffers never merge, even when their addresses
// touch: the driver refuses a copy spanning two allocations. It reports
// whether b grew by a copy.
func merge(b *gpu.CopyBatch, last *uint64, dst, src uint64, n int64, srcBase uint64) bool {
	if ld, ls, ln, ok := b.Last(); ok && srcBase == *last {
		end := ld + uint64(ln)
		if gap := dst - end; dst >= end && gap < wire.Align && src == ls+uint64(ln)+gap {
			b.Extend(int64(gap) + n)
			return false
		}
	}
	b.Add(dst, src, n)
	*last = srcBase
	return true
}

// sameGPU reports whether a and b are memory of one device: of one GPU for
// CUDA memory, so that a kernel launched for b can read a.
func sameGPU(a, b mem.Buffer) bool {
	da, db := gpu.Unfence(a).Device(), gpu.Unfence(b).Device()
	ca, okA := da.(*gpu.CUDADevice)
	cb, okB := db.(*gpu.CUDADevice)
	if okA || okB {
		return okA && okB && ca.Ordinal() == cb.Ordinal()
	}
	return da == db
}

// add queues a copy on the copy engine (see merge).
func (f *deviceFill) add(dst, src uint64, n int64, srcBase uint64) error {
	if merge(&f.batch, &f.lastSrc, dst, src, n, srcBase) && f.batch.Len() >= flushEvery {
		return f.flushEngine()
	}
	return nil
}

// addLarge queues a large device-to-device copy on the next stream in
// turn (see devicePlan.lanes).
func (f *deviceFill) addLarge(dst, src uint64, n int64, srcBase uint64) error {
	i := f.next
	f.next = (f.next + 1) % (len(f.lanes) + 1)
	if i == 0 {
		return f.add(dst, src, n, srcBase)
	}
	f.laneBatch[i-1].Add(dst, src, n)
	f.laneUsed[i-1] = true
	return nil
}

// addKernel queues a copy for the gather kernel (see merge).
func (f *deviceFill) addKernel(ctx context.Context, dst, src uint64, n int64, srcBase uint64) error {
	if merge(&f.kbatch, &f.klastSrc, dst, src, n, srcBase) && f.kbatch.Len() >= flushEvery {
		return f.flushKernel(ctx)
	}
	return nil
}

// flush hands every collected copy and cast to the driver.
func (f *deviceFill) flush(ctx context.Context) error {
	if f.ring != nil {
		if err := f.ring.Drain(ctx); err != nil {
			return fmt.Errorf("pack: %w", err)
		}
	}
	if err := f.flushKernel(ctx); err != nil {
		return err
	}
	if f.caster != nil {
		if err := f.caster.Flush(ctx); err != nil {
			return fmt.Errorf("pack: queueing casts into a device bucket: %w", err)
		}
	}
	return f.flushEngine()
}

func (f *deviceFill) flushEngine() error {
	f.lastSrc = 0
	for i := range f.lanes {
		if f.laneBatch[i].Len() == 0 {
			continue
		}
		f.laneBatch[i].PerCopy = f.plan.perCopy
		if err := f.lanes[i].CopyBatch(&f.laneBatch[i]); err != nil {
			return fmt.Errorf("pack: queueing copies into a device bucket on copy lane %d: %w", i+1, err)
		}
	}
	if f.batch.Len() == 0 {
		return nil
	}
	f.batch.PerCopy = f.plan.perCopy
	if err := f.stream.CopyBatch(&f.batch); err != nil {
		return fmt.Errorf("pack: queueing copies into a device bucket: %w", err)
	}
	return nil
}

// joinLanes makes the copy stream wait for the copies queued on the lanes
// since the last join.
func (f *deviceFill) joinLanes() error {
	for i, used := range f.laneUsed {
		if !used {
			continue
		}
		ev, err := f.lanes[i].Record()
		if err != nil {
			return fmt.Errorf("pack: recording copy lane %d's event: %w", i+1, err)
		}
		err = f.stream.WaitEvent(ev)
		ev.Close() // the driver keeps it until the wait is done
		if err != nil {
			return fmt.Errorf("pack: joining copy lane %d: %w", i+1, err)
		}
		f.laneUsed[i] = false
	}
	return nil
}

func (f *deviceFill) flushKernel(ctx context.Context) error {
	f.klastSrc = 0
	if f.kbatch.Len() == 0 {
		return nil
	}
	if err := f.gather.Copy(ctx, &f.kbatch); err != nil {
		return fmt.Errorf("pack: queueing gathered copies into a device bucket: %w", err)
	}
	return nil
}

// copyIn queues the copy of t's bytes [chunk, chunk+n), as they travel, to
// bucket[off:].
func (f *deviceFill) copyIn(ctx context.Context, t *Tensor, bucket mem.Buffer, off, n, chunk int64) error {
	dst := bucket.DevicePtr() + uint64(off)
	if t.quant != nil && t.quant.w.Device != nil {
		return f.quantIn(t, bucket, dst, n, chunk)
	}
	if t.Device != nil {
		if t.Casts() {
			return f.castIn(t, dst, n, chunk)
		}
		base, _ := gpu.Address(t.Device) // checked by Validate
		return f.copyDevice(ctx, dst, base+uint64(t.DeviceOffset+chunk), n, base, sameGPU(t.Device, bucket))
	}
	if f.ring == nil {
		ring, err := f.stream.NewStagingRing(f.staging)
		if err != nil {
			return fmt.Errorf("pack: %w", err)
		}
		f.ring = ring
	}
	var err error
	if t.Casts() && !f.plan.hostCast && f.castKernel() {
		// Stage the source bytes; the GPU converts them.
		es, eo := int64(t.SourceDType.Size()), int64(t.DType.Size())
		if chunk%eo != 0 || n%eo != 0 {
			return fmt.Errorf("pack: cast %s→%s of tensor %q: %d bytes at %d are not whole elements", t.SourceDType, t.DType, t.Name, n, chunk)
		}
		err = f.ring.Convert(ctx, heldBytes{t}, t.SourceDType, t.DType, dst, n/eo*es, chunk/eo*es)
	} else {
		err = f.ring.Copy(ctx, t, dst, n, chunk) // t.ReadAt converts on the host
	}
	if err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	return nil
}

// copyDevice queues the copy of n bytes of device memory at src (in the
// buffer at base; same: on the bucket's GPU) to the bucket at dst, by
// the plan: with the bucket's checksum when fused, through the gather
// kernel when short, spread over the lanes when long, else on the copy
// stream.
func (f *deviceFill) copyDevice(ctx context.Context, dst, src uint64, n int64, base uint64, same bool) error {
	if f.fuse && same {
		merge(&f.kbatch, &f.klastSrc, dst, src, n, base) // queued whole with the bucket's checksum
		return nil
	}
	if n < f.plan.gatherBelow && same {
		return f.addKernel(ctx, dst, src, n, base)
	}
	if len(f.lanes) > 0 && n >= f.plan.laneAbove {
		return f.addLarge(dst, src, n, base)
	}
	return f.add(dst, src, n, base)
}

// sumDirect ends direct bucket b, whose entries pieces places in the
// sender's memory: with a checksum, it queues the sum of the bucket as
// pack would fill it with zeros between the entries, read from the
// tensors themselves (Gather.CopySumLayout without copies), which b then
// carries for Publish, or which sumDirect waits for itself when wait is
// set. Without one, nothing is queued: no byte of b moves.
func (f *deviceFill) sumDirect(ctx context.Context, b *Bucket, pieces []directPiece, sum, wait bool) error {
	if !sum {
		return nil
	}
	m := &b.Meta
	sums, err := f.checksummer()
	if err != nil {
		return err
	}
	var l gpu.Layout
	for _, p := range pieces {
		l.Add(p.at, p.addr, p.n, 0)
	}
	ps, err := f.gather.CopySumLayout(ctx, &l, m.Length, sums)
	if err != nil {
		return fmt.Errorf("pack: queueing direct bucket %d's checksum: %w", m.Seq, err)
	}
	m.HasChecksum = true
	b.sum = ps
	b.whenReleased(ps.Close)
	if wait {
		if m.Checksum, err = ps.Wait(ctx); err != nil {
			return fmt.Errorf("pack: checksum of direct bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
	}
	return nil
}

// macDirect ends direct bucket b, of a signed round, whose entries
// pieces places in the sender's memory: it queues the MAC under keys of
// the bucket as pack would fill it with zeros between the entries, read
// from the tensors themselves (Gather.CopyMACLayout without copies), on
// the copy stream, in place of its checksum (see mac.go); b then carries
// it for Publish, or macDirect waits for it itself when wait is set.
func (f *deviceFill) macDirect(ctx context.Context, b *Bucket, pieces []directPiece, keys *auth.Keys, kind mac.Kind, wait bool) error {
	var l gpu.Layout
	for _, p := range pieces {
		l.Add(p.at, p.addr, p.n, 0)
	}
	chooseMAC(b, keys, kind)
	if err := queueLayoutMAC(ctx, f.gather, &f.layoutMACs, f.stream, b, &l, keys); err != nil {
		return fmt.Errorf("pack: %w", err)
	}
	if wait {
		return awaitMAC(ctx, b)
	}
	return nil
}

// seal finishes device bucket b: records its ready event (the copies
// into it are queued already) and queues its checksum and MAC as s says,
// or, for a direct bucket, sums or MACs the pieces the receivers read in
// place.
func (f *deviceFill) seal(ctx context.Context, b *Bucket, s sealing) error {
	var err error
	switch {
	case s.direct && s.auth != nil:
		err = f.macDirect(ctx, b, s.pieces, s.auth, s.mac, s.wait)
	case s.direct:
		err = f.sumDirect(ctx, b, s.pieces, s.checksum, s.wait)
	case f.fuse:
		err = f.finishFused(ctx, b, s.wait)
	case s.checksum:
		if err = f.finish(ctx, b); err == nil {
			err = f.queueSum(ctx, b, s.wait)
		}
	default:
		err = f.finish(ctx, b)
	}
	if err != nil {
		return err
	}
	if !s.direct {
		if err := f.queueMAC(ctx, b, s.auth, s.mac, s.wait); err != nil {
			return err
		}
	}
	return f.marks.end(f.stream, b.Meta.Seq, b.Meta.Length)
}

// beginRound decides how this round's buckets are filled: with a
// checksum, where the fused kernel can be used, every device copy on the
// bucket's GPU goes through it (Gather.CopySum), so that the checksum
// costs no pass over the bucket of its own (the copy engine is faster
// for large copies alone, but not with a checksum pass after them:
// docs/benchmarks.md, "Kernels behind the fused checksums"); without one,
// copies go as the plan says.
func (f *deviceFill) beginRound(sum bool) error {
	f.fuse = false
	if !sum || f.plan.gatherBelow == 0 {
		return nil
	}
	if ok, _ := f.gather.SumKernel(); !ok {
		return nil
	}
	c, err := f.checksummer()
	if err != nil || c == nil {
		return err
	}
	f.fuse = true
	return nil
}

// checksummer returns the copy stream's Checksummer, made at first use,
// or nil where the checksum kernel is unavailable (sumsWhy says why).
func (f *deviceFill) checksummer() (*gpu.Checksummer, error) {
	if f.sums == nil && f.sumsWhy == nil {
		f.sums, f.sumsWhy = f.stream.NewChecksummer()
		if f.sumsWhy != nil && !errors.Is(f.sumsWhy, gpu.ErrNoChecksumKernel) {
			err := f.sumsWhy
			f.sums, f.sumsWhy = nil, nil
			return nil, fmt.Errorf("pack: %w", err)
		}
	}
	return f.sums, nil
}

// finishFused ends a bucket filled with the fused kernel: it queues the
// copies that are not the kernel's (staged host tensors, casts, copies
// from another GPU, each into its own part of the bucket; quantized
// weights were queued already, by quantIn), then the
// kernel's copies with the checksum of the whole filled length
// (Gather.CopySum: the bytes the others wrote are read where they lie),
// and fences the buffer with an event recorded after them. b then
// carries the pending sum, which Publish waits for, or which finishFused
// waits for itself when wait is set.
func (f *deviceFill) finishFused(ctx context.Context, b *Bucket, wait bool) error {
	m := &b.Meta
	if f.ring != nil {
		if err := f.ring.Drain(ctx); err != nil {
			return fmt.Errorf("pack: %w", err)
		}
	}
	if f.caster != nil {
		if err := f.caster.Flush(ctx); err != nil {
			return fmt.Errorf("pack: queueing casts into a device bucket: %w", err)
		}
	}
	if err := f.flushEngine(); err != nil {
		return err
	}
	if err := f.joinLanes(); err != nil {
		return err
	}
	f.klastSrc = 0
	ps, err := f.gather.CopySum(ctx, &f.kbatch, gpu.SumOf{Buf: gpu.Unfence(b.Buf), N: m.Length, Side: gpu.SumDst, Sums: f.sums})
	if err != nil {
		return fmt.Errorf("pack: queueing bucket %d's copies with its checksum: %w", m.Seq, err)
	}
	m.HasChecksum = true
	b.sum = ps
	b.whenReleased(ps.Close)
	ev, err := f.stream.Record()
	if err != nil {
		return fmt.Errorf("pack: recording bucket %d's ready event: %w", m.Seq, err)
	}
	b.Buf = gpu.WithFence(b.Buf, ev)
	b.whenReleased(func() { ev.Close() })
	if wait {
		if m.Checksum, err = ps.Wait(ctx); err != nil {
			return fmt.Errorf("pack: checksum of bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
	}
	return nil
}

// finish queues the bucket's remaining copies and fences its buffer with an
// event recorded after them; releasing the bucket destroys the event.
func (f *deviceFill) finish(ctx context.Context, b *Bucket) error {
	if err := f.flush(ctx); err != nil {
		return err
	}
	if err := f.joinLanes(); err != nil {
		return err
	}
	ev, err := f.stream.Record()
	if err != nil {
		return fmt.Errorf("pack: recording bucket %d's ready event: %w", b.Meta.Seq, err)
	}
	b.Buf = gpu.WithFence(b.Buf, ev)
	b.whenReleased(func() { ev.Close() })
	return nil
}

// queueSum queues the checksum of b's filled bytes on the copy stream,
// after everything queued before (the bucket's copies). b then carries the
// pending sum, which Publish waits for, or which queueSum waits for itself
// when wait is set; releasing b gives it back. Where the kernel is
// unavailable, queueSum copies b to the host and sums it there.
func (f *deviceFill) queueSum(ctx context.Context, b *Bucket, wait bool) error {
	m := &b.Meta
	m.HasChecksum = true
	if _, err := f.checksummer(); err != nil {
		return fmt.Errorf("bucket %d: %w", m.Seq, err)
	}
	if f.sums == nil {
		if f.readback == nil {
			f.readback = f.stream.Device().NewReadback()
		}
		host, err := f.readback.Read(ctx, b.Buf, int(m.Length)) // after the bucket's fence
		if err != nil {
			return fmt.Errorf("pack: checksum of bucket %d (version %d) on the host: %w", m.Seq, m.Version, err)
		}
		m.Checksum = checksum.SumParallel(host)
		return nil
	}
	ps, err := f.sums.Queue(gpu.Unfence(b.Buf), m.Length)
	if err != nil {
		return fmt.Errorf("pack: queueing bucket %d's checksum: %w", m.Seq, err)
	}
	b.sum = ps
	b.whenReleased(ps.Close)
	if wait {
		if m.Checksum, err = ps.Wait(ctx); err != nil {
			return fmt.Errorf("pack: checksum of bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
	}
	return nil
}

// settle waits until every queued copy has finished, bounded by ctx or, once
// ctx is done, by finalWait.
func (f *deviceFill) settle(ctx context.Context) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	for _, l := range f.lanes {
		if err := l.Sync(ctx); err != nil {
			return err
		}
	}
	return f.stream.Sync(ctx)
}

// abandon gives back a bucket still being filled, once no copy into it is
// in flight. If that cannot be known, the buffer stays out of the pool
// (Pool.Close then reports it) rather than be reused under a copy.
func (f *deviceFill) abandon(ctx context.Context, b *Bucket) error {
	f.resetQueues()
	if err := f.settle(ctx); err != nil {
		return fmt.Errorf("pack: bucket %d kept out of the pool: its copies did not finish: %w", b.Meta.Seq, err)
	}
	b.Release()
	return nil
}

// endRound ends a round. After a round that succeeded it stops the staging
// readers, waits for the round's copies and returns the GPU's time on each
// bucket of a traced round; the rest (streams, the staging ring's slots,
// kernels' descriptor memory, the checksums of buckets still travelling)
// stays for the next round. After a failed round, or when a wait fails, it
// closes f.
func (f *deviceFill) endRound(ctx context.Context, failed bool) ([]gpuSpan, error) {
	if failed {
		return nil, f.close(ctx)
	}
	f.resetQueues()
	if f.ring != nil {
		if err := f.ring.Stop(ctx); err != nil {
			return nil, errors.Join(fmt.Errorf("pack: %w", err), f.close(ctx))
		}
	}
	if err := f.settle(ctx); err != nil {
		return nil, errors.Join(err, f.close(ctx))
	}
	f.qw = nil
	if err := f.freeSpent(); err != nil {
		return nil, errors.Join(fmt.Errorf("pack: %w", err), f.close(ctx))
	}
	// The GPU's times only inform the trace: where they cannot be
	// read, the trace goes without them rather than fail the round.
	spans, _ := f.marks.spans(ctx, f.stream)
	return spans, nil
}

// close stops the staging readers, waits for the copies, then frees the
// staging ring, the kernels' memory, events and streams. On a failed wait
// it frees nothing that a copy or a reader may still use.
func (f *deviceFill) close(ctx context.Context) error {
	f.resetQueues()
	var rerr error
	if f.ring != nil {
		rerr = f.ring.Close(ctx) // stops its readers, waits for the copy stream
	}
	if err := f.settle(ctx); err != nil {
		return errors.Join(rerr, fmt.Errorf("pack: copies still running after the round; leaving the pack state allocated: %w", err))
	}
	wctx, cancel := bounded(ctx)
	defer cancel()
	errs := []error{rerr}
	if f.gather != nil {
		errs = append(errs, f.gather.Close(wctx))
	}
	if f.sums != nil {
		errs = append(errs, f.sums.Close(wctx))
	}
	errs = append(errs, f.macs.close(wctx), f.layoutMACs.close(wctx))
	if f.caster != nil {
		errs = append(errs, f.caster.Close(wctx))
	}
	if f.quantizer != nil {
		errs = append(errs, f.quantizer.Close(wctx))
	}
	errs = append(errs, f.freeSpent())
	if f.qscales != nil {
		errs = append(errs, f.qscales.Free())
		f.qscales = nil
	}
	if f.readback != nil {
		errs = append(errs, f.readback.Close(wctx))
	}
	f.marks.close()
	for _, l := range f.lanes {
		errs = append(errs, l.Close())
	}
	errs = append(errs, f.stream.Close())
	return errors.Join(errs...)
}

// resetQueues drops the copies collected and not yet queued.
func (f *deviceFill) resetQueues() {
	f.batch.Reset()
	f.kbatch.Reset()
	for i := range f.laneBatch {
		f.laneBatch[i].Reset()
	}
	if f.caster != nil {
		f.caster.Reset()
	}
}
