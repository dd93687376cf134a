package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
)

// The receiver's GPU state, in one place: what its receive, unpack and
// load stages need for device buckets, which a Loader keeps from one round
// to the next and hands to each stage of the round in progress.
//
//   - unpack checks device buckets' checksums with a deviceCheck: a stream
//     of its own and the checksum kernel's slots, or, where the kernel is
//     unavailable, a read-back to the host (and the GPU MAC, mac.go);
//   - load copies device buckets to pinned host memory for the sinks that
//     take host bytes (fetch, through a gpu.Readback), and into the round's
//     one DeviceTarget with a gpuCopier of its own: the gather kernel, the
//     bucket's checksum computed by the same copies where unpack left it
//     to them (copyToTarget);
//   - receive maps the sender's memory that direct buckets lie in (the
//     mappings, direct.go) and, unless load copies from there itself,
//     gathers them into this rank's buffer with another gpuCopier, or, for
//     a sink that reads them in place (InPlaceReader), sums them there
//     with it (receiveDirect, sumInPlace).
//
// Host buckets need none of it: each stage's host branch stays in the
// stage's file, its device branch calls into this one. A Receiver owns one
// Loader for its life; the stage functions used on their own make one per
// round.

// Loader keeps what a receiver's receive, unpack and load stages need for
// device buckets from one round to the next: the stream and slots of the
// GPU checksum that unpack checks buckets with, the pinned memory that
// device buckets are copied to for host sinks (a bucket's size: allocating
// it every round costs more than the round), the streams and kernels'
// memory with which load copies into a DeviceTarget and receive gathers
// direct buckets, and the mappings of the sender's memory that direct
// buckets are read from. A Receiver owns one for its life, and
// Receiver.Close closes it. Host buckets need none of it.
//
// NewLoader allocates nothing. A Loader serves one round at a time (its
// Receive, Unpack and Load stages); its methods are safe to call from any
// goroutine.
type Loader struct {
	mu sync.Mutex
	// check and toHost are kept between rounds; a stage of the round in
	// progress holds each while unpackBusy and loadBusy are set.
	check      *deviceCheck
	toHost     *gpu.Readback
	unpackBusy bool
	// Made at first use and kept until a round fails (the copiers) or
	// Close: load's copies into a DeviceTarget, receive's gathering of
	// direct buckets (used by one stage each), the sender's memory mapped.
	loadCopy  *gpuCopier
	gathering *gpuCopier
	maps      *mappings
	loadBusy  bool
	closed    bool
	// What the last round's load stage handed to its sinks, once the
	// stage has ended: the model version and the tensors.
	lastVersion uint64
	lastTensors int
	// spans: the GPU's time on each bucket load copied, when the last
	// round was traced.
	spans []gpuSpan
	// rank is the receiver's rank, for turns (0: unknown); side is the
	// stream of its passes and releases, and passed the last round of
	// turns it passed (turns.go).
	rank   int
	side   *gpu.Stream
	passed uint32
}

// NewLoader returns an empty Loader.
func NewLoader() *Loader { return &Loader{} }

// takeCheck hands a round's unpack stage its checks, with the GPU state an
// earlier round left.
func (ld *Loader) takeCheck() (*bucketCheck, error) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	switch {
	case ld.closed:
		return nil, errors.New("unpack: the Loader was closed")
	case ld.unpackBusy:
		return nil, errors.New("unpack: the Loader is unpacking another round; a Loader serves one round at a time")
	}
	ld.unpackBusy = true
	c := newBucketCheck(ld.check)
	ld.check = nil
	return c, nil
}

// keepCheck ends the unpack stage's round: it keeps c's GPU state for the
// next round, or, after a failed round, frees it.
func (ld *Loader) keepCheck(ctx context.Context, c *bucketCheck, failed bool) error {
	var err error
	if failed && c.dev != nil {
		err, c.dev = c.dev.close(ctx), nil
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.unpackBusy, ld.check = false, c.dev
	return err
}

// takeLoad hands a round's load stage its state for sink, with the pinned
// memory an earlier round left.
func (ld *Loader) takeLoad(sink Sink) (*loadRound, error) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	switch {
	case ld.closed:
		return nil, errors.New("load: the Loader was closed")
	case ld.loadBusy:
		return nil, errors.New("load: the Loader is loading another round; a Loader serves one round at a time")
	}
	ld.loadBusy, ld.lastVersion, ld.lastTensors = true, 0, 0
	l := &loadRound{ld: ld, sinks: leaves(sink), target: fusedTarget(sink), toHost: ld.toHost, turns: roundTurns{rank: ld.rank}}
	ld.toHost = nil
	return l, nil
}

// keepLoad ends the load stage's round: it notes what the round loaded,
// and keeps l's pinned memory for the next round, or, after a failed round,
// frees it.
func (ld *Loader) keepLoad(ctx context.Context, l *loadRound, failed bool) error {
	var err error
	if failed && l.toHost != nil {
		err, l.toHost = l.toHost.Close(ctx), nil
	}
	ld.mu.Lock()
	c := ld.loadCopy
	ld.mu.Unlock()
	var spans []gpuSpan
	if c != nil && !failed {
		// The GPU's times only inform the trace: where they cannot be
		// read, the trace goes without them rather than fail the round.
		spans, _ = c.marks.spans(ctx, c.stream)
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	ld.spans = spans
	if failed && ld.loadCopy != nil {
		err, ld.loadCopy = errors.Join(err, ld.loadCopy.close(ctx)), nil
	}
	ld.loadBusy, ld.toHost = false, l.toHost
	ld.lastVersion, ld.lastTensors = l.version, l.tensors
	return err
}

// gpuSpans returns the GPU's time on each bucket that the last round's
// load stage copied, when that round was traced.
func (ld *Loader) gpuSpans() []gpuSpan {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.spans
}

// loaded returns the model version and the number of tensors the last
// round handed to its sinks.
func (ld *Loader) loaded() (version uint64, tensors int) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.lastVersion, ld.lastTensors
}

// Close frees the GPU state, after the work still queued on it (waiting at
// most a minute). It fails, freeing nothing, while a round is unpacking or
// loading. Close is idempotent.
func (ld *Loader) Close() error {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	if ld.closed {
		return nil
	}
	if ld.unpackBusy || ld.loadBusy {
		return errors.New("load: Loader closed while a round is unpacking or loading")
	}
	ld.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), finalWait)
	defer cancel()
	var errs []error
	if ld.check != nil {
		errs = append(errs, ld.check.close(ctx))
	}
	if ld.toHost != nil {
		errs = append(errs, ld.toHost.Close(ctx))
	}
	for _, c := range []*gpuCopier{ld.loadCopy, ld.gathering} {
		if c != nil {
			errs = append(errs, c.close(ctx))
		}
	}
	if ld.side != nil {
		if err := ld.side.Sync(ctx); err != nil {
			errs = append(errs, fmt.Errorf("load: a release of turns still running: %w", err))
		} else {
			errs = append(errs, ld.side.Close())
		}
	}
	if ld.maps != nil {
		errs = append(errs, ld.maps.close()) // after every copy out of them
	}
	ld.check, ld.toHost, ld.loadCopy, ld.gathering, ld.maps, ld.side = nil, nil, nil, nil, nil, nil
	return errors.Join(errs...)
}

// canSumAtLoad reports whether the load stage can copy out of buf, a
// device bucket, with its checksum computed by the copies: whether its
// copier of buf's GPU (made now, at the first bucket) has the checksum
// kernel's slots. The unpack stage asks, once per bucket.
func (ld *Loader) canSumAtLoad(buf mem.Buffer) bool {
	c, err := ld.loadCopier(buf)
	return err == nil && c.sums != nil
}

// loadCopier returns load's copier of buf's GPU, making it at first use.
func (ld *Loader) loadCopier(buf mem.Buffer) (*gpuCopier, error) {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return copierFor(&ld.loadCopy, buf)
}

// copierFor returns *c, the copier of buf's GPU, making it if *c is nil.
// A copier of another GPU stays (a receiver's buckets are all on one) and
// copierFor fails.
func copierFor(c **gpuCopier, buf mem.Buffer) (*gpuCopier, error) {
	dev, err := cudaDeviceOf(buf)
	if err != nil {
		return nil, err
	}
	if *c != nil && (*c).dev != dev {
		return nil, fmt.Errorf("a bucket on %s after buckets on %s: give every bucket of a receiver one GPU", dev.Name(), (*c).dev.Name())
	}
	if *c == nil {
		if *c, err = newGPUCopier(dev); err != nil {
			return nil, err
		}
	}
	return *c, nil
}

// receiveDirect makes direct bucket b's entries reachable here: it maps
// the sender's allocations they lie in and, as use says, leaves them where
// they lie (b.srcs) for load's copies into the round's one DeviceTarget;
// leaves them there with their checksum queued, read there, for unpack to
// check (the round's sink is one InPlaceReader); or gathers them into b's
// own buffer, the checksum computed in the same pass for unpack to check.
func (ld *Loader) receiveDirect(ctx context.Context, b *Bucket, use directUse) error {
	m := &b.Meta
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", m.Seq), map[string]any{"bucket": m.Seq, "round": m.Version, "direct": true})
	defer span.End()
	dev, err := cudaDeviceOf(b.Buf)
	if err != nil {
		return fmt.Errorf("bucket %d is direct (read in the sender's memory), which needs device buckets: %w", m.Seq, err)
	}
	ld.mu.Lock()
	if ld.maps == nil {
		ld.maps = &mappings{dev: dev}
	}
	mp := ld.maps
	var c *gpuCopier
	if use != directLeave {
		c, err = copierFor(&ld.gathering, b.Buf)
	}
	ld.mu.Unlock()
	if err != nil {
		return err
	}
	if mp.dev != dev {
		return fmt.Errorf("bucket %d on %s after direct buckets on %s: give every bucket of a receiver one GPU", m.Seq, dev.Name(), mp.dev.Name())
	}
	srcs, words, err := mp.views(m)
	if err != nil {
		return err
	}
	if t := m.Direct.Turns; t != nil {
		if use == directLeave && receiverOf(t, ld.rank) {
			b.turn = &bucketTurn{words: words, DirectTurns: *t}
		} else if err := ld.passTurns(dev, words, t); err != nil {
			return fmt.Errorf("bucket %d: %w", m.Seq, err)
		}
	}
	switch use {
	case directLeave:
		b.srcs = srcs
		return nil
	case directSum:
		b.srcs = srcs
		return c.sumInPlace(ctx, b, srcs)
	}
	span.Args(map[string]any{"bytes": m.Length}) // the span timed the copies
	return c.gatherDirect(ctx, b, srcs)
}

// gpuCopier is what a receiver's stage needs to copy device memory with
// checksums on a GPU: a stream of it, a Gather and a Checksummer of the
// stream. Load copies device buckets into a DeviceTarget with one, receive
// gathers direct buckets into this rank's buffers with another. It is
// used by one goroutine at a time.
type gpuCopier struct {
	dev    *gpu.CUDADevice
	stream *gpu.Stream
	gather *gpu.Gather
	sums   *gpu.Checksummer // nil where the checksum kernel is unavailable
	macs   streamMACer      // direct buckets' MACs, with a group secret
	// marks are the timed events around each bucket's copies in a
	// traced round (load's copier only: "load (GPU)").
	marks gpuMarks
}

func newGPUCopier(dev *gpu.CUDADevice) (*gpuCopier, error) {
	s, err := dev.NewStream()
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	d := &gpuCopier{dev: dev, stream: s, gather: s.NewGather(), marks: gpuMarks{stage: "load"}}
	if d.sums, err = s.NewChecksummer(); err != nil {
		d.sums = nil
		if !errors.Is(err, gpu.ErrNoChecksumKernel) {
			return nil, errors.Join(fmt.Errorf("load: %w", err), d.close(context.Background()))
		}
	}
	return d, nil
}

// sync waits, bounded by ctx, until everything queued on the stream has
// run.
func (d *gpuCopier) sync(ctx context.Context) error { return d.stream.Sync(ctx) }

// close frees the state once nothing queued on its stream runs, bounded
// by ctx or, once ctx is done, by finalWait.
func (d *gpuCopier) close(ctx context.Context) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	if err := d.stream.Sync(ctx); err != nil {
		return fmt.Errorf("load: copies still running; leaving their state allocated: %w", err)
	}
	d.marks.close()
	errs := []error{d.gather.Close(ctx), d.macs.close(ctx)}
	if d.sums != nil {
		errs = append(errs, d.sums.Close(ctx))
	}
	return errors.Join(append(errs, d.stream.Close())...)
}

// queuedLoad is a device bucket whose copies into the round's one
// DeviceTarget are queued on the GPU (queueTarget) and not yet waited for
// (land): load queues the next bucket's copies while these run, so that
// the GPU goes from one bucket to the next without waiting for the host to
// notice the end of the first, check it, acknowledge it and launch the
// second.
type queuedLoad struct {
	u *Unpacked
	// What the copies compute, if anything: the checksum or the MAC.
	sum *gpu.PendingSum
	mac *pendingMAC
	// done is an event after the copies (and after what they compute).
	done *gpu.Event
}

// queueTarget queues the copies of device bucket u into the round's one
// DeviceTarget with the Loader's copier of u's GPU (the gather kernel),
// out of the bucket or, for a direct bucket left in place, out of the
// sender's memory. Where unpack left the checksum to load (u.sumAtLoad)
// the copies compute it (gpu.Gather.CopySum, the bucket the side they
// read, or CopySumLayout of the entries where they lie) and land checks it
// (verifySum); where it left a direct bucket's MAC to load (u.macAtLoad),
// they compute that (gpu.Gather.CopyMACLayout) and land checks it
// (verifyMAC). In a traced round a pair of timed events brackets the
// copies ("load (GPU)": Receiver.traceGPU).
func (l *loadRound) queueTarget(ctx context.Context, u *Unpacked, traced bool) (*queuedLoad, error) {
	b, t := u.Bucket, l.target
	m := &b.Meta
	c, err := l.ld.loadCopier(b.Buf)
	if err != nil {
		return nil, err
	}
	direct := b.srcs != nil
	var cb gpu.CopyBatch
	var lay gpu.Layout
	for _, v := range u.Views {
		e := v.Entry
		buf, off, err := t.Target(ctx, e)
		if err != nil {
			return nil, fmt.Errorf("loading tensor %q from bucket %d: %w", e.Name, m.Seq, err)
		}
		if e.Size == 0 {
			continue
		}
		if !sameGPU(buf, b.Buf) {
			return nil, fmt.Errorf("loading tensor %q from bucket %d: the sink's memory is on %s, the buckets on %s; give the receiver a sink on its buckets' GPU", e.Name, m.Seq, buf.Device().Name(), b.Buf.Device().Name())
		}
		to, _ := gpu.Address(buf)
		from, ok := gpu.Address(v.Device)
		if !ok {
			return nil, fmt.Errorf("loading tensor %q from bucket %d: its source is not memory the GPU can address", e.Name, m.Seq)
		}
		to, from = to+uint64(off), from+uint64(v.Offset)
		if u.sumAtLoad && direct || u.macAtLoad {
			lay.Add(e.Offset, from, e.Size, to)
		} else {
			cb.Add(to, from, e.Size)
		}
	}
	if err := l.turns.before(c.stream, b); err != nil {
		return nil, err
	}
	if traced {
		if err := c.marks.start(c.stream, m.Seq, m.Version); err != nil {
			return nil, err
		}
	}
	q := &queuedLoad{u: u}
	switch {
	case u.macAtLoad:
		q.mac, err = layoutMAC(ctx, c.gather, &c.macs, c.stream, b, &lay, b.auth)
	case u.sumAtLoad && direct:
		q.sum, err = c.gather.CopySumLayout(ctx, &lay, m.Length, c.sums)
	case u.sumAtLoad:
		q.sum, err = c.gather.CopySum(ctx, &cb, gpu.SumOf{Buf: gpu.Unfence(b.Buf), N: m.Length, Side: gpu.SumSrc, Sums: c.sums})
	default:
		err = c.gather.Copy(ctx, &cb)
	}
	if err == nil {
		err = l.turns.after(b)
	}
	if err == nil {
		q.done, err = c.stream.Record()
	}
	if err == nil {
		err = c.marks.end(c.stream, m.Seq, m.Length)
	}
	if err != nil {
		// What was queued still runs: it is waited for before the
		// bucket is released.
		return nil, errors.Join(fmt.Errorf("copying bucket %d into the model: %w", m.Seq, err), q.wait(ctx))
	}
	return q, nil
}

// land waits for q's copies, checks the checksum or MAC they computed,
// flushes the sink, then commits the round after its last bucket and
// acknowledges the bucket.
func (l *loadRound) land(ctx context.Context, q *queuedLoad) error {
	m := &q.u.Bucket.Meta
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d (landing)", m.Seq), map[string]any{"bucket": m.Seq, "round": m.Version})
	defer span.End()
	var got uint64
	var tag mac.Tag
	err := q.done.Wait(ctx)
	switch {
	case err != nil:
	case q.sum != nil:
		got, err = q.sum.Wait(ctx)
	case q.mac != nil:
		tag, err = q.mac.wait(ctx)
	}
	q.close()
	if err != nil {
		return fmt.Errorf("copying bucket %d into the model: %w", m.Seq, err)
	}
	if err := l.target.Flush(ctx); err != nil {
		return fmt.Errorf("copying bucket %d into the model: %w", m.Seq, err)
	}
	switch {
	case q.u.sumAtLoad:
		err = verifySum(m, got)
	case q.u.macAtLoad:
		err = verifyMAC(m, tag)
	}
	if err != nil {
		return err
	}
	return l.finish(ctx, m, q.u.Bucket)
}

// wait waits for q's copies, bounded by ctx or, once ctx is done, by
// finalWait, without checking them (the round has failed), and frees what
// they used.
func (q *queuedLoad) wait(ctx context.Context) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	var err error
	switch {
	case q.sum != nil:
		_, err = q.sum.Wait(ctx)
	case q.mac != nil:
		_, err = q.mac.wait(ctx)
	case q.done != nil:
		err = q.done.Wait(ctx)
	}
	q.close()
	return err
}

func (q *queuedLoad) close() {
	if q.sum != nil {
		q.sum.Close()
	}
	if q.mac != nil {
		q.mac.close()
	}
	if q.done != nil {
		q.done.Close()
	}
	q.sum, q.mac, q.done = nil, nil, nil
}

// fetch copies device bucket b's filled bytes to the host.
func (l *loadRound) fetch(ctx context.Context, b *Bucket) ([]byte, error) {
	if l.toHost == nil {
		dev, err := cudaDeviceOf(b.Buf)
		if err != nil {
			return nil, err
		}
		l.toHost = dev.NewReadback()
	}
	host, err := l.toHost.Read(ctx, b.Buf, int(b.Meta.Length))
	if err != nil {
		return nil, fmt.Errorf("copying bucket %d to the host for a host sink: %w", b.Meta.Seq, err)
	}
	return host, nil
}

// device returns the check of device buckets on b's GPU, made at the
// first device bucket.
func (c *bucketCheck) device(b *Bucket) (*deviceCheck, error) {
	if c.dev == nil {
		dev, err := cudaDeviceOf(b.Buf)
		if err != nil {
			return nil, fmt.Errorf("unpack: bucket %d: %w", b.Meta.Seq, err)
		}
		c.dev = &deviceCheck{dev: dev}
	}
	return c.dev, nil
}

// deviceCheck sums device buckets: with the GPU checksum kernel on a
// stream of its own, or, where the kernel is unavailable, on the CPU after
// copying the bucket back. It is used by one unpack goroutine at a time.
type deviceCheck struct {
	dev      *gpu.CUDADevice
	stream   *gpu.Stream
	sums     *gpu.Checksummer // nil until first used, or where unavailable
	sumsWhy  error            // why the checksum kernel is unavailable
	readback *gpu.Readback
	// macs checks device buckets' MACs (mac.go).
	macs deviceMAC
}

// sum returns the checksum of b's filled bytes, after b's fence.
func (c *deviceCheck) sum(ctx context.Context, b *Bucket) (uint64, error) {
	if c.stream == nil {
		s, err := c.dev.NewStream()
		if err != nil {
			return 0, err
		}
		c.stream = s
	}
	if c.sums == nil && c.sumsWhy == nil {
		c.sums, c.sumsWhy = c.stream.NewChecksummer()
		if c.sumsWhy != nil && !errors.Is(c.sumsWhy, gpu.ErrNoChecksumKernel) {
			err := c.sumsWhy
			c.sums, c.sumsWhy = nil, nil
			return 0, err
		}
	}
	if c.sums == nil {
		if c.readback == nil {
			c.readback = c.dev.NewReadback()
		}
		host, err := c.readback.Read(ctx, b.Buf, int(b.Meta.Length))
		if err != nil {
			return 0, fmt.Errorf("on the host: %w", err)
		}
		return checksum.SumParallel(host), nil
	}
	ps, err := c.sums.Queue(b.Buf, b.Meta.Length) // after b's fence, if any
	if err != nil {
		return 0, err
	}
	defer ps.Close()
	return ps.Wait(ctx)
}

// close frees the stream and the kernel's slots once nothing queued on
// them runs, bounded by ctx or, once ctx is done, by finalWait.
func (c *deviceCheck) close(ctx context.Context) error {
	ctx, cancel := bounded(ctx)
	defer cancel()
	var errs []error
	if c.readback != nil {
		errs = append(errs, c.readback.Close(ctx))
	}
	errs = append(errs, c.macs.close(ctx))
	if c.stream == nil {
		return errors.Join(errs...)
	}
	if err := c.stream.Sync(ctx); err != nil {
		return errors.Join(append(errs, fmt.Errorf("unpack: a checksum still running; leaving its memory allocated: %w", err))...)
	}
	if c.sums != nil {
		errs = append(errs, c.sums.Close(ctx))
	}
	errs = append(errs, c.stream.Close())
	c.stream, c.sums = nil, nil
	return errors.Join(errs...)
}
