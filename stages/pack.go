package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/internal/parallel"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
)

// The pack stage: tensors into bucket buffers.
//
// Into host buckets, pack reads each tensor's bytes (converting a tensor
// that casts) straight into the bucket, large tensors by several goroutines
// at once, and computes the bucket's checksum on the CPU.
//
// Into device buckets (a Pool of device memory), it fills them on the GPU
// through a copy stream that a Packer keeps from round to round (with the
// kernels' memory):
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

// PackConfig says how Pack fills buckets.
type PackConfig struct {
	// Pool supplies the bucket buffers; its buffer size is the bucket size.
	Pool *Pool
	// Version is the model version of the round.
	Version uint64
	// FirstSeq is the Seq of the round's first bucket.
	FirstSeq uint64
	// Checksum computes each bucket's checksum (checked by receivers).
	Checksum bool
	// Auth, the run's keys when the group has a secret, has each bucket
	// carry a MAC of its bytes (see mac.go) and its metadata signed by
	// Publish; nil: neither.
	Auth *auth.Keys
	// Source, when set, travels in the round's first bucket.
	Source *SourceInfo
	// Direct leaves device buckets unfilled where every tensor in them
	// can be read in place by the receivers (direct buckets, see
	// direct.go): for endpoints whose receivers all share the sender's
	// GPU (transport.DirectReader). Sender sets it.
	Direct bool

	// maxTensors bounds the round's tensors; 0 means MaxTensors, the
	// receivers' limit (tests lower it).
	maxTensors int
}

// Pack adds the stage that copies tensors into bucket buffers taken from
// cfg.Pool. A bucket is sent on when the next tensor does not fit; a tensor
// larger than a bucket is split into chunks (on Align boundaries) across
// buckets; the last bucket of the round carries IsLast, and a round with no
// tensors still sends one empty last bucket. A tensor name seen twice, or a
// tensor that fails Validate, stops the round with an error naming it.
//
// Into device buckets, the stage makes its own device state (streams,
// kernels' memory, the pinned staging ring) and frees it when it returns;
// it then also waits for each bucket's checksum before sending the bucket
// on. A Packer keeps that state between rounds instead, and its Pack
// leaves the checksums to Publish.
func Pack(p *pipeline.Pipeline, in *pipeline.Stream[*Tensor], cfg PackConfig) *pipeline.Stream[*Bucket] {
	return packStage(p, in, cfg, nil)
}

// Pack adds the stage that Pack adds, packing device buckets with the
// Packer's state. The Packer serves one round at a time.
func (pk *Packer) Pack(p *pipeline.Pipeline, in *pipeline.Stream[*Tensor], cfg PackConfig) *pipeline.Stream[*Bucket] {
	return packStage(p, in, cfg, pk)
}

func packStage(p *pipeline.Pipeline, in *pipeline.Stream[*Tensor], cfg PackConfig, pk *Packer) *pipeline.Stream[*Bucket] {
	return pipeline.Stage(p, "pack", in, 1, func(ctx context.Context, in *pipeline.Input[*Tensor], out *pipeline.Output[*Bucket]) (err error) {
		own := pk == nil
		pk := pk
		if own {
			pk = NewPacker()
			defer func() { err = errors.Join(err, pk.Close()) }()
		}
		dev, err := pk.begin(ctx, cfg.Pool)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, pk.end(ctx, dev, err != nil)) }()
		if dev != nil {
			if err := dev.beginRound(cfg.Checksum); err != nil {
				return err
			}
		}
		r := packing{ctx: ctx, cfg: cfg, out: out, seq: cfg.FirstSeq, seen: map[string]struct{}{}, dev: dev, waitSums: own, pk: pk}
		if r.cfg.maxTensors == 0 {
			r.cfg.maxTensors = MaxTensors
		}
		defer func() { pk.noteDirect(r.directs) }()
		defer func() { err = errors.Join(err, r.abandon()) }()
		for t := range in.All() {
			if err := r.add(t); err != nil {
				return err
			}
		}
		if err := in.Err(); err != nil {
			return err
		}
		if err := r.take(); err != nil {
			return err
		}
		return r.emit(true)
	})
}

// Packer keeps what Pack needs for device buckets from one round to the
// next: the copy streams, the kernels' descriptor memory, the checksums of
// buckets still travelling to Publish, and the pinned staging ring.
// Creating them costs more than a small round takes, so a Sender owns one
// for its life and Sender.Close closes it. Host buckets need none of it.
//
// NewPacker allocates nothing: the first round that packs device buckets
// makes the state on their GPU, and Close or a round that fails frees it. A
// Packer serves one round at a time; its methods are safe to call from any
// goroutine.
type Packer struct {
	plan    devicePlan
	staging gpu.StagingConfig

	mu     sync.Mutex
	busy   bool
	closed bool
	dev    *deviceFill // nil until a round packs device buckets
	spans  []gpuSpan   // the GPU's time on each bucket of the last round, when it was traced

	// exports are the allocations direct buckets' tensors lie in, exported
	// once and kept between rounds (used by the pack goroutine only);
	// logger is told once of memory that cannot be exported (nil:
	// slog.Default()).
	exports *exports
	logger  *slog.Logger
	directs int // direct buckets of the last round
}

// noteDirect records how many of the round's buckets were direct.
func (pk *Packer) noteDirect(n int) {
	pk.mu.Lock()
	pk.directs = n
	pk.mu.Unlock()
}

// lastDirect returns how many buckets of the last round were direct.
func (pk *Packer) lastDirect() int {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return pk.directs
}

// NewPacker returns an empty Packer with the default copy plan and staging
// ring.
func NewPacker() *Packer { return newPacker(defaultPlan, gpu.DefaultStagingConfig()) }

// newPacker returns a Packer that fills device buckets with plan, staging
// host tensors through a ring of staging's sizes (tests and benchmarks
// compare plans and rings).
func newPacker(plan devicePlan, staging gpu.StagingConfig) *Packer {
	staging.PerCopy = staging.PerCopy || plan.perCopy
	return &Packer{plan: plan, staging: staging}
}

// begin marks the Packer busy with a round into pool's buffers and returns
// the device state for them, making it if needed; nil for host buckets.
func (pk *Packer) begin(ctx context.Context, pool *Pool) (*deviceFill, error) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	switch {
	case pk.closed:
		return nil, errors.New("pack: the Packer was closed")
	case pk.busy:
		return nil, errors.New("pack: the Packer is packing another round; a Packer serves one round at a time")
	}
	if !pool.onDevice() {
		pk.busy = true
		return nil, nil
	}
	dev, err := cudaDeviceOf(pool.Buffers()[0])
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	if pk.dev != nil && pk.dev.stream.Device() != dev {
		// Another GPU's state: this round's buckets are elsewhere.
		if err := pk.dev.close(ctx); err != nil {
			return nil, err
		}
		pk.dev = nil
	}
	if pk.dev == nil {
		if pk.dev, err = newDeviceFill(dev, pk.plan, pk.staging); err != nil {
			return nil, err
		}
	}
	pk.busy, pk.spans = true, nil
	return pk.dev, nil
}

// end ends a round begun with begin: after a round that succeeded it keeps
// the device state for the next one and notes the GPU's time on its
// buckets; after one that failed it frees the state.
func (pk *Packer) end(ctx context.Context, f *deviceFill, failed bool) error {
	var spans []gpuSpan
	var err error
	closed := false
	if f != nil {
		spans, err = f.endRound(ctx, failed)
		closed = failed || err != nil // endRound closed f
	}
	pk.mu.Lock()
	defer pk.mu.Unlock()
	pk.busy, pk.spans = false, spans
	if closed {
		pk.dev = nil
	}
	return err
}

// gpuSpans returns the GPU's time on each device bucket of the last
// round, when that round was traced.
func (pk *Packer) gpuSpans() []gpuSpan {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return pk.spans
}

// Close frees the device state, after the work still queued on its streams
// (waiting at most a minute). It fails, freeing nothing, while a round is
// packing. Close is idempotent.
func (pk *Packer) Close() error {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.closed {
		return nil
	}
	if pk.busy {
		return errors.New("pack: Packer closed while a round is packing")
	}
	pk.closed = true
	if pk.dev == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), finalWait)
	defer cancel()
	err := pk.dev.close(ctx)
	pk.dev = nil
	return err
}

// packing is one round of the pack stage. It is used by the pack goroutine
// only.
type packing struct {
	ctx   context.Context
	cfg   PackConfig
	out   *pipeline.Output[*Bucket]
	seq   uint64
	index int
	seen  map[string]struct{}

	cur  *Bucket // the bucket being filled, nil between buckets
	buf  []byte  // the host bytes of cur; nil for a device bucket
	fill int64
	span *pipeline.Span
	// dev queues the copies of device buckets; nil for host buckets.
	// waitSums: wait for each device bucket's checksum here (dev is
	// freed when the stage returns, before Publish would wait).
	dev      *deviceFill
	waitSums bool

	// pk is the Packer of the round. direct: cur is a direct bucket,
	// whose entries pieces places in the sender's memory.
	pk      *Packer
	direct  bool
	pieces  []directPiece
	directs int // direct buckets sent on
}

func alignUp(n int64) int64 { return (n + Align - 1) &^ (Align - 1) }

// The staging ring mirrors the bucket layout's alignment.
var _ [gpu.StagingAlign - Align]struct{}
var _ [Align - gpu.StagingAlign]struct{}

// take makes sure a bucket is being filled, waiting for a free buffer.
func (r *packing) take() error {
	if r.cur != nil {
		return nil
	}
	buf, err := r.cfg.Pool.Get(r.ctx)
	if err != nil {
		return err
	}
	if buf.Host() == nil && r.dev == nil {
		r.cfg.Pool.Put(buf)
		return fmt.Errorf("pack: bucket buffers on %s are neither host nor CUDA device memory", buf.Device().Name())
	}
	r.cur = r.cfg.Pool.Bucket(buf, BucketMeta{Seq: r.seq, Index: r.index, Version: r.cfg.Version})
	if r.index == 0 {
		r.cur.Meta.Source = r.cfg.Source
	}
	r.direct, r.pieces = r.cfg.Direct && r.dev != nil, r.pieces[:0]
	if r.direct {
		r.cur.Meta.Direct = newDirectInfo()
	}
	r.buf, r.fill = buf.Host(), 0
	name := fmt.Sprintf("bucket %d", r.seq)
	if r.dev != nil {
		name += " (queued)" // the GPU does the work later: see pack (GPU)
	}
	r.span = pipeline.StartSpan(r.ctx, name, map[string]any{"bucket": r.seq, "round": r.cfg.Version})
	if r.span != nil && r.dev != nil {
		if err := r.dev.markStart(r.cur); err != nil {
			return err
		}
	}
	pipeline.Count(r.ctx, "buffers held", float64(r.cfg.Pool.Held()))
	return nil
}

// emit finishes the current bucket and sends it downstream.
func (r *packing) emit(last bool) error {
	b := r.cur
	b.Meta.Length, b.Meta.IsLast = r.fill, last
	args := map[string]any{"entries": len(b.Meta.Entries)}
	if r.dev != nil {
		var err error
		switch {
		case r.direct:
			err = r.dev.sumDirect(r.ctx, b, r.pieces, r.cfg.Checksum, r.waitSums)
		case r.dev.fuse:
			err = r.dev.finishFused(r.ctx, b, r.waitSums)
		case r.cfg.Checksum:
			if err = r.dev.finish(r.ctx, b); err == nil {
				err = r.dev.queueSum(r.ctx, b, r.waitSums)
			}
		default:
			err = r.dev.finish(r.ctx, b)
		}
		if err != nil {
			return err // abandon releases b once its copies are done
		}
		if err := r.dev.queueMAC(r.ctx, b, r.cfg.Auth, r.waitSums); err != nil {
			return err // abandon releases b once its copies are done
		}
		if err := r.dev.markEnd(b); err != nil {
			return err
		}
		args["queued_bytes"] = r.fill // not "bytes": the host span is no measure of the copies
	} else {
		if r.cfg.Checksum {
			b.Meta.Checksum, b.Meta.HasChecksum = checksum.SumParallel(r.buf[:r.fill]), true
		}
		macHost(b, r.cfg.Auth, r.buf[:r.fill])
		args["bytes"] = r.fill
	}
	if r.span != nil {
		r.span.Args(args)
		r.span.End()
	}
	if r.direct {
		r.directs++
	}
	r.cur, r.buf, r.span = nil, nil, nil
	r.seq++
	r.index++
	return r.out.Send(b) // on failure Send releases b
}

// abandon gives back a bucket still being filled when the stage stops early
// (a device bucket once the copies into it have finished).
func (r *packing) abandon() error {
	b := r.cur
	if b == nil {
		return nil
	}
	r.cur = nil
	if r.dev != nil {
		return r.dev.abandon(r.ctx, b)
	}
	b.Release()
	return nil
}

func (r *packing) add(t *Tensor) error {
	size, err := t.Validate()
	if err != nil {
		return err
	}
	if _, dup := r.seen[t.Name]; dup {
		return fmt.Errorf("tensor %q appears twice in round %d; tensor names must be unique", t.Name, r.cfg.Version)
	}
	if len(r.seen) >= r.cfg.maxTensors {
		return fmt.Errorf("round %d has more than %d tensors (at %q); receivers refuse more", r.cfg.Version, r.cfg.maxTensors, t.Name)
	}
	r.seen[t.Name] = struct{}{}
	// A tensor that fits in one bucket is never split: if it does not fit
	// in what is left of this one, start the next.
	bsize := int64(r.cfg.Pool.BufferSize())
	if r.cur != nil && len(r.cur.Meta.Entries) > 0 && size <= bsize && alignUp(r.fill)+size > bsize {
		if err := r.emit(false); err != nil {
			return err
		}
	}
	for chunk := int64(0); chunk < size || (size == 0 && chunk == 0); {
		if err := r.take(); err != nil {
			return err
		}
		off := alignUp(r.fill)
		if size == 0 {
			off = r.fill // no bytes: never pushes past the filled length
		}
		room := bsize - off
		n := min(size-chunk, room)
		if n < size-chunk {
			n &^= Align - 1 // split on Align boundaries within the tensor
		}
		if n <= 0 && size > 0 {
			if err := r.emit(false); err != nil {
				return err
			}
			continue
		}
		var src *EntrySource
		if r.direct && n > 0 {
			if src, err = r.placeDirect(t, off, n, chunk); err != nil {
				return err
			}
		}
		switch {
		case src != nil: // read in place by the receivers
		case r.dev != nil:
			err = r.dev.copyIn(r.ctx, t, r.cur.Buf, off, n, chunk)
		default:
			// A large read runs on several goroutines, in pieces that
			// start on Align boundaries of the tensor (whole elements of
			// a tensor that casts).
			err = parallel.Pieces(r.ctx, n, func(o, k int64) error {
				return t.ReadAt(r.buf[off+o:off+o+k], chunk+o)
			})
		}
		if err != nil {
			return err
		}
		r.cur.Meta.Entries = append(r.cur.Meta.Entries, Entry{
			Name: t.Name, DType: t.DType, Shape: t.Shape, Offset: off, Size: n, Chunk: chunk, Total: size, Src: src,
		})
		r.fill = off + n
		chunk += n
		if size == 0 {
			break
		}
	}
	return nil
}

// placeDirect places chunk [chunk, chunk+n) of t, at off of the direct
// bucket being filled, where it lies in the sender's memory, and returns
// its source; or, for a tensor a direct bucket cannot take, turns the
// bucket into one pack fills (packDirect) and returns nil.
func (r *packing) placeDirect(t *Tensor, off, n, chunk int64) (*EntrySource, error) {
	p, e, ok, err := r.pk.directSource(t, r.cur.Buf, chunk, r.cfg.Version)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, r.packDirect()
	}
	p.at, p.n = off, n
	r.pieces = append(r.pieces, p)
	return &EntrySource{Alloc: allocIndex(&r.cur.Meta, e), Offset: int64(p.addr - e.info.Base)}, nil
}

// packDirect turns the direct bucket being filled into one that pack
// fills: the entries placed so far are copied in, and lose their sources.
func (r *packing) packDirect() error {
	b := r.cur
	for _, p := range r.pieces {
		if err := r.dev.copyDevice(r.ctx, b.Buf.DevicePtr()+uint64(p.at), p.addr, p.n, p.base, true); err != nil {
			return err
		}
	}
	for i := range b.Meta.Entries {
		b.Meta.Entries[i].Src = nil
	}
	b.Meta.Direct, r.direct, r.pieces = nil, false, r.pieces[:0]
	return nil
}

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

	// macs computes bucket MACs on a stream of its own (mac.go).
	macs deviceMAC

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
	marks []gpuMark
}

func newDeviceFill(dev *gpu.CUDADevice, plan devicePlan, staging gpu.StagingConfig) (*deviceFill, error) {
	s, err := dev.NewStream()
	if err != nil {
		return nil, fmt.Errorf("pack: creating the copy stream: %w", err)
	}
	f := &deviceFill{stream: s, plan: plan, staging: staging}
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
		if gap := dst - end; dst >= end && gap < Align && src == ls+uint64(ln)+gap {
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

// quantIn queues bytes [chunk, chunk+n) of t, one of the two tensors of a
// device weight that Quantize picked, into the bucket at dst, on the copy
// stream, so that the bucket's ready event, checksum and MAC come after:
// the codes straight from the weight by the quantize kernel, which also
// writes the scales of the blocks the chunk touches into f.qscales; the
// scales copied from there (after a launch that computes them all, in
// case the codes did not go through f). Both are queued at once, not
// collected: the scratch is then reused in stream order by the next
// weight.
func (f *deviceFill) quantIn(t *Tensor, bucket mem.Buffer, dst uint64, n, chunk int64) error {
	q := t.quant
	if n == 0 {
		return nil
	}
	if !sameGPU(q.w.Device, bucket) {
		return fmt.Errorf("pack: quantize %q on the GPU: the weight is memory of %s and the buckets are on %s; hand it in on the buckets' GPU, or in host memory",
			q.w.Name, q.w.Device.Device().Name(), bucket.Device().Name())
	}
	if f.quantizer == nil {
		f.quantizer = f.stream.NewQuantizer()
	}
	if ok, why := f.quantizer.Kernel(); !ok {
		return fmt.Errorf("pack: quantize %q on the GPU: %w; hand the weight in host memory, or leave it out with an exclude pattern", q.w.Name, why)
	}
	if err := f.quantScratch(q); err != nil {
		return err
	}
	base, _ := gpu.Address(q.w.Device) // checked by Validate
	job := gpu.QuantJob{Src: base + uint64(q.w.DeviceOffset), From: q.from, Rows: q.rows, Cols: q.cols, Scales: f.qscales.DevicePtr()}
	if t.role == quantCodes {
		job.First, job.End, job.Dst = chunk, chunk+n, dst
		if err := f.quantizer.Queue(job); err != nil {
			return fmt.Errorf("pack: quantize %q: %w", q.w.Name, err)
		}
		f.qcoded += n
		return nil
	}
	if f.qcoded != q.rows*q.cols {
		if err := f.quantizer.Queue(job); err != nil { // the scales only
			return fmt.Errorf("pack: scales of %q: %w", q.w.Name, err)
		}
		f.qcoded = q.rows * q.cols
	}
	if err := f.stream.CopyDtoDPtr(dst, f.qscales.DevicePtr()+uint64(chunk), int(n)); err != nil {
		return fmt.Errorf("pack: copying the scales of %q into a device bucket: %w", q.w.Name, err)
	}
	return nil
}

// quantScratch makes f.qscales hold the scales of q: from q's first
// tensor on, and large enough (at least 1 MiB, so that it rarely grows).
func (f *deviceFill) quantScratch(q *quantized) error {
	if f.qw == q {
		return nil
	}
	need := int(4 * q.nbr * q.nbc)
	if f.qscales == nil || f.qscales.Len() < need {
		b, err := f.stream.Device().Alloc(max(need, 1<<20))
		if err != nil {
			return fmt.Errorf("pack: scratch memory for the scales of %q: %w", q.w.Name, err)
		}
		if f.qscales != nil {
			f.qspent = append(f.qspent, f.qscales) // launches queued may still write it
		}
		f.qscales = b
	}
	f.qw, f.qcoded = q, 0
	return nil
}

// freeSpent frees the scratch memory outgrown; the copies must have
// settled.
func (f *deviceFill) freeSpent() error {
	var errs []error
	for _, b := range f.qspent {
		errs = append(errs, b.Free())
	}
	f.qspent = nil
	return errors.Join(errs...)
}

// castKernel reports whether the GPU cast kernel is usable.
func (f *deviceFill) castKernel() bool {
	if f.caster == nil {
		f.caster = f.stream.NewCaster()
	}
	ok, _ := f.caster.Kernel()
	return ok
}

// castIn queues the conversion of device tensor t, output bytes [chunk,
// chunk+n), into the bucket at dst, by the GPU cast kernel.
func (f *deviceFill) castIn(t *Tensor, dst uint64, n, chunk int64) error {
	from, to := t.SourceDType, t.DType
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
	spans, _ := f.timeMarks(ctx)
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
	errs = append(errs, f.macs.close(wctx))
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
	f.closeMarks()
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

// gpuMark is the pair of timed events around the GPU's work on one bucket:
// start on the copy stream before the bucket's first copy, end after its
// ready event and checksum.
type gpuMark struct {
	seq, round uint64
	bytes      int64
	start, end *gpu.Event
}

// gpuSpan is when the GPU worked on one bucket, in host time.
type gpuSpan struct {
	seq, round uint64
	bytes      int64
	start, end time.Time
}

// markStart records the timed event that starts b's work on the GPU.
func (f *deviceFill) markStart(b *Bucket) error {
	ev, err := f.stream.RecordTimed()
	if err != nil {
		return fmt.Errorf("pack: recording bucket %d's start event: %w", b.Meta.Seq, err)
	}
	f.marks = append(f.marks, gpuMark{seq: b.Meta.Seq, round: b.Meta.Version, start: ev})
	return nil
}

// markEnd records the timed event that ends b's work on the GPU, if its
// start was recorded.
func (f *deviceFill) markEnd(b *Bucket) error {
	k := len(f.marks) - 1
	if k < 0 || f.marks[k].seq != b.Meta.Seq || f.marks[k].end != nil {
		return nil
	}
	ev, err := f.stream.RecordTimed()
	if err != nil {
		return fmt.Errorf("pack: recording bucket %d's end event: %w", b.Meta.Seq, err)
	}
	f.marks[k].end, f.marks[k].bytes = ev, b.Meta.Length
	return nil
}

// timeMarks turns the marks of the round, whose work has finished, into
// host times and destroys them. The GPU's clock is tied to the host's by
// one more timed event, recorded on the idle copy stream and waited for.
func (f *deviceFill) timeMarks(ctx context.Context) ([]gpuSpan, error) {
	if len(f.marks) == 0 {
		return nil, nil
	}
	defer f.closeMarks()
	before := time.Now()
	anchor, err := f.stream.RecordTimed()
	if err != nil {
		return nil, fmt.Errorf("pack: recording the round's clock event: %w", err)
	}
	defer anchor.Close()
	if err := anchor.Wait(ctx); err != nil {
		return nil, fmt.Errorf("pack: waiting for the round's clock event: %w", err)
	}
	after := time.Now()
	at := before.Add(after.Sub(before) / 2) // when the GPU passed the anchor, give or take a few µs
	var spans []gpuSpan
	for _, m := range f.marks {
		if m.end == nil {
			continue
		}
		s, err := gpu.Elapsed(m.start, anchor)
		if err != nil {
			return nil, fmt.Errorf("pack: reading bucket %d's GPU time: %w", m.seq, err)
		}
		e, err := gpu.Elapsed(m.end, anchor)
		if err != nil {
			return nil, fmt.Errorf("pack: reading bucket %d's GPU time: %w", m.seq, err)
		}
		spans = append(spans, gpuSpan{seq: m.seq, round: m.round, bytes: m.bytes, start: at.Add(-s), end: at.Add(-e)})
	}
	return spans, nil
}

// closeMarks destroys the round's timed events.
func (f *deviceFill) closeMarks() {
	for _, m := range f.marks {
		m.start.Close()
		if m.end != nil {
			m.end.Close()
		}
	}
	f.marks = f.marks[:0]
}
