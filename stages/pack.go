package stages

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/internal/parallel"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/wire"
)

// The pack stage: tensors into bucket buffers.
//
//	tensor ──► packing.add ──► filler.copyIn ──► packing.emit ──► filler.seal ──► out
//	           (its chunks'      (their bytes      (a full or        (checksum,
//	            places)           into place)       last bucket)      MAC)
//
// packing (this file) lays each round out: which bucket and offset each
// tensor's chunks take (split on Align boundaries), when a bucket is full,
// the metadata of its entries. A filler puts the bytes there and seals the
// full bucket:
// hostFill for host buckets, on the CPU (large tensors read by several
// goroutines at once, the checksum and MAC computed on the CPU), and
// deviceFill for device buckets (a Pool of device memory), on the GPU,
// through a copy stream that a Packer keeps from round to round
// (pack_device.go says how). Direct buckets (direct.go) are laid out
// here too, their entries placed where the receivers read them in place.

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
	// MAC is the bucket MAC Auth's buckets carry: keyed BLAKE3 (mac.BLAKE3,
	// also the zero value) or Poly1305-AES under a nonce per bucket
	// (mac.Poly1305AES), whose GPU kernels do less work per byte. The
	// metadata says which; receivers verify either.
	MAC mac.Kind
	// Source, when set, travels in the round's first bucket.
	Source *wire.SourceInfo
	// Direct leaves device buckets unfilled where every tensor in them
	// can be read in place by the receivers (direct buckets, see
	// direct.go): for endpoints whose receivers all share the sender's
	// GPU (transport.DirectReader). Sender sets it.
	Direct bool
	// turns, on a direct round whose receivers take turns, are the
	// round's turns (Alloc filled per bucket) and turnWords the words'
	// address; Sender sets them (turns.go).
	turns     *wire.DirectTurns
	turnWords uint64

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
		r := packing{ctx: ctx, cfg: cfg, out: out, seq: cfg.FirstSeq, seen: map[string]struct{}{}, filler: hostFill{}, dev: dev, waitSums: own, pk: pk}
		if dev != nil {
			r.filler = dev
		}
		if r.cfg.maxTensors == 0 {
			r.cfg.maxTensors = wire.MaxTensors
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

// filler is what fills buckets of one kind of memory: hostFill for host
// buckets, deviceFill (pack_device.go) for device buckets. The pack
// goroutine lays the bucket out (packing) and hands each piece of it to
// the filler, then has the filler seal the full bucket before sending it
// on.
type filler interface {
	// copyIn fills [off, off+n) of bucket with bytes [chunk, chunk+n) of
	// t (converted where t casts or is quantized).
	copyIn(ctx context.Context, t *Tensor, bucket mem.Buffer, off, n, chunk int64) error
	// seal finishes b, whose Meta.Length is set: its checksum and MAC as
	// s says. On failure b stays the caller's, for abandon.
	seal(ctx context.Context, b *Bucket, s sealing) error
	// abandon releases b, a bucket the round stopped filling (a device
	// bucket once the copies into it have finished).
	abandon(ctx context.Context, b *Bucket) error
}

// sealing says how a full bucket is sealed.
type sealing struct {
	checksum bool          // compute the bucket's checksum
	auth     *auth.Keys    // MAC the bucket's bytes with these keys; nil: no MAC
	mac      mac.Kind      // the MAC: keyed BLAKE3 (also "") or Poly1305-AES
	wait     bool          // wait for the device's checksum and MAC here
	direct   bool          // a direct bucket: the receivers read its pieces in place
	pieces   []directPiece // a direct bucket's pieces
}

// hostFill fills host buckets on the CPU.
type hostFill struct{}

// copyIn reads the bytes into the bucket; a large read runs on several
// goroutines, in pieces that start on Align boundaries of the tensor
// (whole elements of a tensor that casts).
func (hostFill) copyIn(ctx context.Context, t *Tensor, bucket mem.Buffer, off, n, chunk int64) error {
	buf := bucket.Host()
	return parallel.Pieces(ctx, n, func(o, k int64) error {
		return t.ReadAt(buf[off+o:off+o+k], chunk+o)
	})
}

// seal sums and MACs the bucket's bytes on the CPU.
func (hostFill) seal(_ context.Context, b *Bucket, s sealing) error {
	data := b.Buf.Host()[:b.Meta.Length]
	if s.checksum {
		b.Meta.Checksum, b.Meta.HasChecksum = checksum.SumParallel(data), true
	}
	macHost(b, s.auth, s.mac, data)
	return nil
}

// abandon releases b at once: no copy into it can be in flight.
func (hostFill) abandon(_ context.Context, b *Bucket) error {
	b.Release()
	return nil
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
	fill int64
	span *pipeline.Span
	// filler fills and seals the round's buckets: dev for device
	// buckets, hostFill for host ones. dev is nil for host buckets.
	// waitSums: wait for each device bucket's checksum here (dev is
	// freed when the stage returns, before Publish would wait).
	filler   filler
	dev      *deviceFill
	waitSums bool

	// pk is the Packer of the round. direct: cur is a direct bucket,
	// whose entries pieces places in the sender's memory.
	pk      *Packer
	direct  bool
	pieces  []directPiece
	directs int // direct buckets sent on
}

// addTurns names the round's turns, if any, in the direct bucket being
// filled, their words among its allocations.
func (r *packing) addTurns() error {
	if r.cfg.turns == nil || r.pk == nil {
		return nil
	}
	pk, m := r.pk, &r.cur.Meta
	if pk.exports == nil {
		dev, err := cudaDeviceOf(r.cur.Buf)
		if err != nil {
			return err
		}
		pk.exports = &exports{dev: dev}
	}
	e, err := pk.exports.lookup(r.cfg.turnWords, r.cfg.Version)
	if err != nil {
		return fmt.Errorf("pack: exporting the turns' words: %w", err)
	}
	t := *r.cfg.turns
	t.Alloc = allocIndex(m, e)
	m.Direct.Turns = &t
	return nil
}

// noBytes returns what a direct bucket has for a buffer: the pool's
// buffer of no bytes on its GPU (Pool.noBytes).
func (r *packing) noBytes() (mem.Buffer, error) {
	buf, err := r.cfg.Pool.noBytes()
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	return buf, nil
}

// alignUp rounds n up to where the current bucket's next entry starts:
// a multiple of wire.Align or, in a direct bucket with a MAC, of a MAC
// chunk, so that the receivers can compute the MAC of the entries where
// they lie (gpu.Gather.CopyMACLayout).
func (r *packing) alignUp(n int64) int64 {
	a := int64(wire.Align)
	if r.direct && r.cfg.Auth != nil {
		a = gpu.MACLayoutAlign
	}
	return (n + a - 1) &^ (a - 1)
}

// The staging ring mirrors the bucket layout's alignment.
var _ [gpu.StagingAlign - wire.Align]struct{}
var _ [wire.Align - gpu.StagingAlign]struct{}

// take makes sure a bucket is being filled, waiting for a free buffer;
// a direct bucket takes none (its bytes stay in the sender's tensors)
// until it turns into one pack fills (packDirect), so that the pack stage
// of a direct round never waits for the receivers to free a buffer.
func (r *packing) take() error {
	if r.cur != nil {
		return nil
	}
	meta := wire.BucketMeta{Seq: r.seq, Index: r.index, Version: r.cfg.Version}
	r.direct, r.pieces = r.cfg.Direct && r.dev != nil, r.pieces[:0]
	if r.direct {
		buf, err := r.noBytes()
		if err != nil {
			return err
		}
		r.cur = &Bucket{Meta: meta, Buf: buf}
		r.cur.Meta.Direct = newDirectInfo()
		if err := r.addTurns(); err != nil {
			return err
		}
	} else {
		buf, err := r.cfg.Pool.Get(r.ctx)
		if err != nil {
			return err
		}
		if buf.Host() == nil && r.dev == nil {
			r.cfg.Pool.Put(buf)
			return fmt.Errorf("pack: bucket buffers on %s are neither host nor CUDA device memory", buf.Device().Name())
		}
		r.cur = r.cfg.Pool.Bucket(buf, meta)
	}
	if r.index == 0 {
		r.cur.Meta.Source = r.cfg.Source
	}
	r.fill = 0
	name := fmt.Sprintf("bucket %d", r.seq)
	if r.dev != nil {
		name += " (queued)" // the GPU does the work later: see pack (GPU)
	}
	r.span = pipeline.StartSpan(r.ctx, name, map[string]any{"bucket": r.seq, "round": r.cfg.Version})
	if r.span != nil && r.dev != nil {
		if err := r.dev.marks.start(r.dev.stream, r.cur.Meta.Seq, r.cur.Meta.Version); err != nil {
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
	s := sealing{checksum: r.cfg.Checksum, auth: r.cfg.Auth, mac: r.cfg.MAC, wait: r.waitSums, direct: r.direct, pieces: r.pieces}
	if err := r.filler.seal(r.ctx, b, s); err != nil {
		return err // abandon releases b (a device bucket once its copies are done)
	}
	if r.dev != nil {
		args["queued_bytes"] = r.fill // not "bytes": the host span is no measure of the copies
	} else {
		args["bytes"] = r.fill
	}
	if r.span != nil {
		r.span.Args(args)
		r.span.End()
	}
	if r.direct {
		r.directs++
	}
	r.cur, r.span = nil, nil
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
	return r.filler.abandon(r.ctx, b)
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
	if r.cur != nil && len(r.cur.Meta.Entries) > 0 && size <= bsize && r.alignUp(r.fill)+size > bsize {
		if err := r.emit(false); err != nil {
			return err
		}
	}
	for chunk := int64(0); chunk < size || (size == 0 && chunk == 0); {
		if err := r.take(); err != nil {
			return err
		}
		off := r.alignUp(r.fill)
		if size == 0 {
			off = r.fill // no bytes: never pushes past the filled length
		}
		room := bsize - off
		n := min(size-chunk, room)
		if n < size-chunk {
			n &^= wire.Align - 1 // split on Align boundaries within the tensor
		}
		if n <= 0 && size > 0 {
			if err := r.emit(false); err != nil {
				return err
			}
			continue
		}
		var src *wire.EntrySource
		if r.direct && n > 0 {
			if src, err = r.placeDirect(t, off, n, chunk); err != nil {
				return err
			}
		}
		if src == nil && (n > 0 || !r.direct) { // else read in place by the receivers, or nothing to copy
			if err := r.filler.copyIn(r.ctx, t, r.cur.Buf, off, n, chunk); err != nil {
				return err
			}
		}
		r.cur.Meta.Entries = append(r.cur.Meta.Entries, wire.Entry{
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
func (r *packing) placeDirect(t *Tensor, off, n, chunk int64) (*wire.EntrySource, error) {
	p, e, ok, err := r.pk.directSource(t, r.cur.Buf, chunk, r.cfg.Version)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, r.packDirect()
	}
	p.at, p.n = off, n
	r.pieces = append(r.pieces, p)
	return &wire.EntrySource{Alloc: allocIndex(&r.cur.Meta, e), Offset: int64(p.addr - e.info.Base)}, nil
}

// packDirect turns the direct bucket being filled into one that pack
// fills: the entries placed so far are copied in, and lose their sources.
func (r *packing) packDirect() error {
	b := r.cur
	buf, err := r.cfg.Pool.Get(r.ctx)
	if err != nil {
		return err
	}
	b.Buf, b.put = buf, r.cfg.Pool.Put
	pipeline.Count(r.ctx, "buffers held", float64(r.cfg.Pool.Held()))
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

// Both fillers are fillers.
var (
	_ filler = hostFill{}
	_ filler = (*deviceFill)(nil)
)
