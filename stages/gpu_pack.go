package stages

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
)

// Packing into device buckets.
//
// When a Pool's buffers are device memory (Host() == nil), Pack fills them
// on the GPU instead of with host copies, through a copy stream that the
// pool keeps from round to round (with the kernels' memory):
//
//   - device tensors (Tensor.Device) are copied device to device: those
//     on the bucket's GPU, in copies shorter than the plan's gatherBelow,
//     by the gather kernel (gpu.Gather: one launch copies thousands of
//     ranges, where the copy engine costs about 4.5 µs per copy), the
//     others by the copy engine, the large ones spread over the plan's
//     lanes (more streams, joined back before the bucket's event);
//   - tensors that Cast wraps are converted into the bucket by the GPU cast
//     kernel (gpu.Caster), on the copy stream: device tensors straight
//     from their memory, host tensors from their source bytes, staged as
//     below and copied to device scratch memory first;
//   - host tensors (Data or Reader) are read, by several goroutines in
//     parallel, into a ring of pinned staging buffers (StagingBuffers ×
//     StagingSize) and copied host to device from there, so that the copy
//     runs at pinned speed while the next bytes are read (gpu_staging.go);
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
// stream) or waits for it on the host (CUDA IPC) — the pack stage never
// blocks on its own copies. The event is destroyed when the bucket is
// released. A staging buffer is refilled only after the event recorded
// after the copies out of it has completed.
//
// Checksums: with PackConfig.Checksum, each device bucket's checksum is
// computed on the GPU after its copies (see gpu_checksum.go).

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
	// hostCast converts host tensors that Cast wraps on the host, as they
	// are read, even where the GPU cast kernel could (to compare the two).
	hostCast bool
}

// defaultPlan is the plan Pack uses: device-to-device copies under 16 MiB
// through the gather kernel, larger ones on the copy engine, spread over
// four streams. Measured on an H200 (docs/benchmarks.md): 100,000
// scattered 4 KiB tensors at 0.62 µs each through the kernel against 4.94
// through cuMemcpyBatchAsync; 1 GiB of 16 MiB tensors into 256 MiB buckets
// at 1437 GB/s through the kernel, 1335 on one copy stream, 1471 on two and
// 1664 on four (one plain copy: 1902); 16 GiB of 256 MiB tensors into 1 GiB
// buckets at 1965 GB/s on one stream, 2109 on two, 2103 on three, 2104 on
// four (one plain copy: 2128) — BenchmarkGPUPackDevice and
// BenchmarkGPUPackDevice16GiB.
var defaultPlan = devicePlan{gatherBelow: 16 << 20, lanes: 4, laneAbove: 16 << 20}

// finalWait bounds the wait for a round's copies when the round's own
// context is already done (so that memory is never freed under a copy).
const finalWait = time.Minute

// isDevicePool reports whether p's buffers are device memory.
func isDevicePool(p *Pool) bool {
	bufs := p.Buffers()
	return len(bufs) > 0 && onDevice(bufs[0])
}

// deviceFill queues the copies that fill device buckets for one round of
// Pack. It is used by the pack goroutine only.
type deviceFill struct {
	dev    *gpu.CUDADevice
	stream *gpu.Stream
	plan   devicePlan
	// batch is the copy engine's queue: host staging copies and the
	// device copies that do not go to the kernel.
	batch gpu.CopyBatch
	// lastSrc is the address of the buffer the batch's last copy reads
	// from (0: none), so that a copy continuing it across alignment
	// padding can merge.
	lastSrc uint64

	// kernel is set when device copies may go to the gather kernel:
	// kbatch is its queue, klastSrc as lastSrc, and onGPU reports
	// whether the kernel can read a buffer (device memory of the
	// bucket's GPU).
	kernel   bool
	gather   *gpu.Gather
	kbatch   gpu.CopyBatch
	klastSrc uint64
	onGPU    func(mem.Buffer) bool

	// caster converts tensors that Cast wraps into the bucket (the GPU
	// cast kernel), created at the first such tensor; scratch holds the
	// source bytes of host tensors it converts (gpu_staging.go).
	caster  *gpu.Caster
	scratch deviceScratch

	// sums computes bucket checksums on the copy stream, created at the
	// first; sumsWhy says why the kernel is unavailable.
	sums    *gpu.Checksummer
	sumsWhy error

	// lanes are the extra streams of plan.lanes, with a queue each;
	// laneUsed marks those with copies into the current bucket, next is
	// the stream (0: the copy stream, i: lanes[i-1]) of the next large
	// copy.
	lanes     []*gpu.Stream
	laneBatch []gpu.CopyBatch
	laneUsed  []bool
	next      int

	// stage reads host tensors into pinned staging and queues their
	// copies (gpu_staging.go); nil until the round's first host tensor.
	stage *stager
}

func newDeviceFill(pool *Pool) (*deviceFill, error) {
	dev, err := cudaDeviceOf(pool.Buffers()[0])
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	s, err := dev.NewStream()
	if err != nil {
		return nil, fmt.Errorf("pack: creating the copy stream: %w", err)
	}
	f := &deviceFill{dev: dev, stream: s, plan: defaultPlan}
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
	if f.plan.gatherBelow > 0 {
		f.kernel, f.gather = true, s.NewGather()
		f.onGPU = func(b mem.Buffer) bool {
			d, ok := gpu.Unfence(b).Device().(*gpu.CUDADevice)
			return ok && d.Ordinal() == dev.Ordinal()
		}
	}
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
		if gap := dst - end; dst >= end && gap < Align && src == ls+uint64(ln)+gap {
			b.Extend(int64(gap) + n)
			return false
		}
	}
	b.Add(dst, src, n)
	*last = srcBase
	return true
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
	if err := f.stage.drain(ctx); err != nil {
		return err
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

// copyIn queues the copy of t's bytes [chunk, chunk+n) to bucket[off:].
func (f *deviceFill) copyIn(ctx context.Context, t *Tensor, bucket mem.Buffer, off, n, chunk int64) error {
	dst := bucket.DevicePtr() + uint64(off)
	cr, cast := t.Reader.(*castReader)
	if cast && cr.src.Device != nil {
		return f.castIn(cr, dst, n, chunk)
	}
	if t.Device != nil {
		base, _ := gpu.Address(t.Device) // checked by Validate
		src := base + uint64(t.DeviceOffset+chunk)
		if f.kernel && n < f.plan.gatherBelow && f.onGPU(t.Device) {
			return f.addKernel(ctx, dst, src, n, base)
		}
		if len(f.lanes) > 0 && n >= f.plan.laneAbove {
			return f.addLarge(dst, src, n, base)
		}
		return f.add(dst, src, n, base)
	}
	if f.stage == nil {
		if f.caster == nil {
			f.caster = f.stream.NewCaster()
		}
		g := &streamStaging{ctx: ctx, dev: f.dev, stream: f.stream, perCopy: f.plan.perCopy, caster: f.caster, scratch: &f.scratch}
		st, err := newStager(g, stagingDefaults())
		if err != nil {
			return err
		}
		f.stage = st
	}
	if cast && !f.plan.hostCast {
		if ok, _ := f.caster.Kernel(); ok {
			// Stage the source bytes; the GPU converts them.
			from, to := cr.src.DType, cr.to
			es, eo := int64(from.Size()), int64(to.Size())
			if chunk%eo != 0 || n%eo != 0 {
				return fmt.Errorf("pack: cast %s→%s of tensor %q: %d bytes at %d are not whole elements", from, to, t.Name, n, chunk)
			}
			return f.stage.stageAs(ctx, cr.src, dst, n/eo*es, chunk/eo*es, to)
		}
	}
	return f.stage.stage(ctx, t, dst, n, chunk)
}

// castIn queues the conversion of the device tensor behind cr, output
// bytes [chunk, chunk+n), into the bucket at dst, by the GPU cast kernel.
func (f *deviceFill) castIn(cr *castReader, dst uint64, n, chunk int64) error {
	t, from, to := cr.src, cr.src.DType, cr.to
	es, eo := int64(from.Size()), int64(to.Size())
	if chunk%eo != 0 || n%eo != 0 {
		return fmt.Errorf("pack: cast %s→%s of tensor %q: %d bytes at %d are not whole elements", from, to, t.Name, n, chunk)
	}
	if n == 0 {
		return nil
	}
	if f.caster == nil {
		f.caster = f.stream.NewCaster()
	}
	base, _ := gpu.Address(t.Device) // checked by Validate
	src := base + uint64(t.DeviceOffset+chunk/eo*es)
	if err := f.caster.Add(dst, src, n/eo, from, to); err != nil {
		return fmt.Errorf("pack: tensor %q: %w", t.Name, err)
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
	put := b.put
	b.put = func(buf mem.Buffer) {
		ev.Close()
		if put != nil {
			put(gpu.Unfence(buf))
		}
	}
	return nil
}

// settle waits until every queued copy has finished, bounded by ctx or, once
// ctx is done, by finalWait.
func (f *deviceFill) settle(ctx context.Context) error {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), finalWait)
		defer cancel()
	}
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

// close stops the staging readers, waits for the round's copies, then frees
// the staging buffers, events and stream. On a failed wait it frees nothing
// that a copy or a reader may still use.
func (f *deviceFill) close(ctx context.Context) error {
	f.resetQueues()
	serr := f.stage.stop(ctx)
	if err := f.settle(ctx); err != nil {
		return errors.Join(serr, fmt.Errorf("pack: copies still running after the round; leaving the staging memory allocated: %w", err))
	}
	var errs []error
	if f.gather != nil {
		errs = append(errs, f.gather.Close(ctx))
	}
	if f.sums != nil {
		errs = append(errs, f.sums.Close(ctx))
	}
	if f.caster != nil {
		errs = append(errs, f.caster.Close(ctx))
	}
	if f.scratch.buf != nil {
		errs = append(errs, f.scratch.buf.Free())
	}
	if serr != nil {
		errs = append(errs, serr)
	} else {
		errs = append(errs, f.stage.free())
	}
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

// endRound ends Pack's use of f. After a round that succeeded it stops the
// staging readers, waits for the round's copies and gives the staging
// slots back (gpu_staging.go), then leaves the rest (streams, kernels'
// descriptor memory, the checksums of buckets still travelling) to pool
// for its next round, so that a round does not pay for creating them
// again; pool.Close frees them. After a failed round, or when pool keeps
// another already, it closes f.
func (f *deviceFill) endRound(ctx context.Context, pool *Pool, failed bool) error {
	if failed {
		return f.close(ctx)
	}
	f.resetQueues()
	if err := f.stage.stop(ctx); err != nil {
		return errors.Join(err, f.close(ctx))
	}
	if err := f.settle(ctx); err != nil {
		return errors.Join(err, f.close(ctx))
	}
	if err := f.stage.free(); err != nil {
		return errors.Join(err, f.close(ctx))
	}
	f.stage = nil
	if !pool.keepFill(f) {
		return f.close(ctx)
	}
	return nil
}
