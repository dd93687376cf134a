package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/wire"
)

// The load stage: checked views into the sinks.
//
// Load hands each view to the sink, calls the sink's Commit after the
// round's last bucket, acknowledges the bucket to the root, and only then
// releases it. A sink says what else it can do by the optional interfaces
// it implements, and Load asks each sink itself, never a wrapper:
//
//   - Beginner: told the round's source before its first tensor;
//   - DeviceSink: takes a device bucket's views as they are and copies them
//     on the GPU; Load calls its Flush, which returns once every copy out
//     of the bucket has finished, and only then releases the bucket. Any
//     other sink gets host bytes: a device bucket is copied to pinned host
//     memory once for all of them (gpu.Readback);
//   - DeviceTarget: a DeviceSink that says where each entry's bytes go on
//     the GPU, so that Load copies them there itself, with the bucket's
//     checksum computed by the same copies when the sink is the round's
//     only one (gpu.Gather.CopySum; see unpack.go) instead of a pass of
//     its own;
//   - Committer: told when the whole group has committed the round
//     (Receiver.Sync);
//   - Holder: says what a failed round leaves in it (Receiver.State);
//   - Aborter: drops what it kept apart of a round that failed (a
//     shadowed sink's unfinished files), which the Receiver asks for.
//
// Several sinks are combined with Sinks, which Load and the Receiver see
// through (Unwrap), so that each member keeps its capabilities. The sinks
// themselves are package sink's; the interfaces stay here, with the stages
// that consume them.

// Sink is where a receiver puts what it received.
type Sink interface {
	// Load takes one entry: a whole tensor, or one chunk of a tensor
	// larger than a bucket (chunks come in order). data is valid only
	// during the call.
	Load(ctx context.Context, e *wire.Entry, data []byte) error
	// Commit is called once the last bucket of a round has been loaded,
	// with the round's model version, before this rank acknowledges that
	// bucket: an error fails the round on every rank. The version is not
	// committed yet (other receivers may still fail); Committer's
	// Committed says when it is.
	Commit(ctx context.Context, version uint64) error
}

// Beginner is implemented by Sinks that want to know a round's source
// before its first tensor; Load calls Begin with the first bucket's
// SourceInfo (nil when the sender sent none).
type Beginner interface {
	Begin(ctx context.Context, version uint64, info *wire.SourceInfo) error
}

// DeviceSink is a Sink that takes device views of a bucket.
type DeviceSink interface {
	Sink
	// LoadDevice queues the copy of entry e's bytes, which lie at
	// src[off:off+e.Size] in device memory; chunks come in order. It may
	// return before the copy has run.
	LoadDevice(ctx context.Context, e *wire.Entry, src mem.Buffer, off int64) error
	// Flush returns once every copy queued so far, by LoadDevice or by
	// Load, has finished reading its source, so that the bucket can be
	// reused.
	Flush(ctx context.Context) error
}

// DeviceTarget is a DeviceSink whose device memory Load writes into
// itself: Target says where each entry goes, Load copies there on a
// stream of its own (with the bucket's checksum computed in the same
// pass) and calls Flush once its copies have finished.
type DeviceTarget interface {
	DeviceSink
	// Target returns the device memory where entry e's bytes go,
	// buf[off:off+e.Size] (buf is nil for an entry of no bytes),
	// allocating e's tensor at its first sight as LoadDevice would.
	// Chunks come in order.
	Target(ctx context.Context, e *wire.Entry) (buf mem.Buffer, off int64, err error)
}

// fusedTarget returns sink's one leaf when it is a DeviceTarget, or nil.
func fusedTarget(sink Sink) DeviceTarget {
	ls := leaves(sink)
	if len(ls) != 1 {
		return nil
	}
	t, _ := ls[0].(DeviceTarget)
	return t
}

// Holding says what a Sink keeps of the rounds it takes, and so what a
// round that fails after reaching it leaves there (Receiver.State).
type Holding int

const (
	// HoldsInPlace: the sink updates what it holds as bytes arrive
	// (sink.HostModel, DeviceModel, Checksums): a failed round that reached
	// it leaves it partial. A Sink that is no Holder holds in place.
	HoldsInPlace Holding = iota
	// HoldsShadowed: the sink loads a round into a copy of its own and
	// switches to it only in Committed (a sink.HostModel made
	// WithShadow, sink.WriteSafetensors): a failed round leaves the
	// committed version in place.
	HoldsShadowed
	// HoldsNothing: the sink keeps no copy of the model (sink.Verify): a
	// failed round leaves nothing to resync.
	HoldsNothing
)

// Holder is implemented by Sinks that say what they hold; see Holding.
type Holder interface {
	Holding() Holding
}

// Aborter is implemented by Sinks that keep a round's work apart until it
// is committed and can drop it (sink.WriteSafetensors' hidden round
// directory): a Receiver calls Abort after a round that failed, so that
// nothing of the round is left behind. Abort keeps the last committed
// version.
type Aborter interface {
	Abort() error
}

// holding returns what s says it holds.
func holding(s Sink) Holding {
	if h, ok := s.(Holder); ok {
		return h.Holding()
	}
	return HoldsInPlace
}

// Sinks returns a Sink that hands every entry to each of sinks in turn.
// Load and the Receiver see through it to each member (Unwrap), so each
// keeps its capabilities: a DeviceSink gets device views, the others host
// bytes (a device bucket copied to the host once for all), and each
// Beginner and Committer is told. Called directly, its methods do the
// same for the members that take host bytes. Its Holding is the weakest
// of its members': in place if any member holds in place.
func Sinks(sinks ...Sink) *SinkSet {
	var all SinkSet
	for _, s := range sinks {
		all = append(all, leaves(s)...)
	}
	return &all
}

// SinkSet is the Sink that Sinks returns.
type SinkSet []Sink

// Unwrap returns the members.
func (s *SinkSet) Unwrap() []Sink { return *s }

// Load hands the entry to every member.
func (s *SinkSet) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	for _, m := range *s {
		if err := m.Load(ctx, e, data); err != nil {
			return err
		}
	}
	return nil
}

// Begin tells every member that is a Beginner.
func (s *SinkSet) Begin(ctx context.Context, version uint64, info *wire.SourceInfo) error {
	return begin(ctx, *s, version, info)
}

// Commit commits every member.
func (s *SinkSet) Commit(ctx context.Context, version uint64) error {
	return commit(ctx, *s, version)
}

// Committed tells every member that is a Committer.
func (s *SinkSet) Committed(ctx context.Context, version uint64) error {
	return committed(ctx, *s, version)
}

// Holding is HoldsInPlace if any member holds in place, else HoldsShadowed
// if any member is shadowed, else HoldsNothing.
func (s *SinkSet) Holding() Holding { return holdingOf(*s) }

// Abort aborts every member that is an Aborter.
func (s *SinkSet) Abort() error { return abort(*s) }

// leaves returns the sinks s stands for: the members of whatever it
// unwraps to (Sinks), recursively, or s itself.
func leaves(s Sink) []Sink {
	u, ok := s.(interface{ Unwrap() []Sink })
	if !ok {
		return []Sink{s}
	}
	var out []Sink
	for _, m := range u.Unwrap() {
		out = append(out, leaves(m)...)
	}
	return out
}

func begin(ctx context.Context, sinks []Sink, version uint64, info *wire.SourceInfo) error {
	for _, s := range sinks {
		if b, ok := s.(Beginner); ok {
			if err := b.Begin(ctx, version, info); err != nil {
				return err
			}
		}
	}
	return nil
}

func commit(ctx context.Context, sinks []Sink, version uint64) error {
	for _, s := range sinks {
		if err := s.Commit(ctx, version); err != nil {
			return err
		}
	}
	return nil
}

func committed(ctx context.Context, sinks []Sink, version uint64) error {
	for _, s := range sinks {
		if c, ok := s.(Committer); ok {
			if err := c.Committed(ctx, version); err != nil {
				return err
			}
		}
	}
	return nil
}

func abort(sinks []Sink) error {
	var errs []error
	for _, s := range sinks {
		if a, ok := s.(Aborter); ok {
			errs = append(errs, a.Abort())
		}
	}
	return errors.Join(errs...)
}

func holdingOf(sinks []Sink) Holding {
	h := HoldsNothing
	for _, s := range sinks {
		switch holding(s) {
		case HoldsInPlace:
			return HoldsInPlace
		case HoldsShadowed:
			h = HoldsShadowed
		}
	}
	return h
}

// Load adds a receiver's last stage: it hands every view to sink (see the
// comment at the top of this file), commits the round after its last
// bucket, then acknowledges and releases each bucket. For device buckets
// that host sinks take, the stage makes its own pinned staging and frees
// it when it returns; a Loader keeps it between rounds instead.
func Load(p *pipeline.Pipeline, in *pipeline.Stream[*Unpacked], sink Sink) {
	loadStage(p, in, sink, nil)
}

// Load adds the stage that Load adds, copying device buckets to the host
// through the Loader's pinned memory.
func (ld *Loader) Load(p *pipeline.Pipeline, in *pipeline.Stream[*Unpacked], sink Sink) {
	loadStage(p, in, sink, ld)
}

func loadStage(p *pipeline.Pipeline, in *pipeline.Stream[*Unpacked], sink Sink, ld *Loader) {
	pipeline.Sink(p, "load", in, func(ctx context.Context, in *pipeline.Input[*Unpacked]) (err error) {
		if ld == nil {
			ld = NewLoader()
			defer func() { err = errors.Join(err, ld.Close()) }()
		}
		l, err := ld.takeLoad(sink)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, ld.keepLoad(ctx, l, err != nil)) }()
		for u := range in.All() {
			err := l.deliver(ctx, u)
			u.Bucket.delivered = err == nil
			pipeline.Fail(ctx, err) // before a lent bucket's release tells the root
			u.Release()
			if err != nil {
				return err
			}
			pipeline.CountBytes(ctx, u.Bucket.Meta.Length)
		}
		return in.Err()
	})
}

// loadRound is one round of the load stage. It is used by the load goroutine
// only.
type loadRound struct {
	ld    *Loader
	sinks []Sink
	// target is sinks' one leaf when it is a DeviceTarget: the Loader
	// copies device buckets into it (copyToTarget).
	target DeviceTarget
	// toHost copies device buckets for the sinks that take host bytes;
	// nil until the first.
	toHost *gpu.Readback
	// version and tensors: the round's model version and the tensors
	// (whole, or first chunks) handed to the sinks so far.
	version uint64
	tensors int
}

// deliver hands u's views to the sinks, then commits the round after its
// last bucket and acknowledges the bucket.
func (l *loadRound) deliver(ctx context.Context, u *Unpacked) error {
	m := &u.Bucket.Meta
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", m.Seq), map[string]any{"bucket": m.Seq, "round": m.Version, "bytes": m.Length})
	defer span.End()
	l.version = m.Version
	if m.Index == 0 {
		if err := begin(ctx, l.sinks, m.Version, m.Source); err != nil {
			return fmt.Errorf("starting version %d: %w", m.Version, err)
		}
	}
	// The tensors reach the sinks from here on: a failure now leaves an
	// in-place sink partial (Receiver.State).
	for _, v := range u.Views {
		if v.Entry.Chunk == 0 {
			l.tensors++
		}
	}
	if l.target != nil && onDevice(u.Bucket.Buf) {
		if err := l.copyToTarget(ctx, u); err != nil {
			return err
		}
		return l.finish(ctx, m, u.Bucket)
	}
	device := onDevice(u.Bucket.Buf)
	var host []byte // a device bucket's bytes on the host, fetched for the first host sink
	for _, s := range l.sinks {
		ds, isDev := s.(DeviceSink)
		if device && isDev {
			for _, v := range u.Views {
				if err := ds.LoadDevice(ctx, v.Entry, v.Device, v.Offset); err != nil {
					return fmt.Errorf("loading tensor %q from bucket %d: %w", v.Entry.Name, m.Seq, err)
				}
			}
		} else {
			if device && host == nil && m.Length > 0 {
				var err error
				if host, err = l.fetch(ctx, u.Bucket); err != nil {
					return err
				}
			}
			for _, v := range u.Views {
				data := v.Data
				if device {
					data = host[v.Entry.Offset : v.Entry.Offset+v.Entry.Size]
				}
				if err := s.Load(ctx, v.Entry, data); err != nil {
					return fmt.Errorf("loading tensor %q from bucket %d: %w", v.Entry.Name, m.Seq, err)
				}
			}
		}
		if isDev {
			// Its copies out of the bucket (or of host bytes to the
			// GPU): done before release.
			if err := ds.Flush(ctx); err != nil {
				return fmt.Errorf("copying bucket %d into the model: %w", m.Seq, err)
			}
		}
	}
	return l.finish(ctx, m, u.Bucket)
}

// finish commits the round after its last bucket and acknowledges b.
func (l *loadRound) finish(ctx context.Context, m *wire.BucketMeta, b *Bucket) error {
	if m.IsLast {
		if err := commit(ctx, l.sinks, m.Version); err != nil {
			return fmt.Errorf("committing version %d: %w", m.Version, err)
		}
	}
	if b.Ack != nil {
		return b.Ack()
	}
	return nil
}

// copyToTarget copies device bucket u into the round's one DeviceTarget
// with the Loader's copier of u's GPU (the gather kernel), out of the
// bucket or, for a direct bucket left in place, out of the sender's
// memory. Where unpack left the checksum to load (u.sumAtLoad) the copies
// compute it (gpu.Gather.CopySum, the bucket the side they read, or
// CopySumLayout of the entries where they lie) and copyToTarget checks it
// (verifySum). It returns once the copies have finished and the sink is
// flushed.
func (l *loadRound) copyToTarget(ctx context.Context, u *Unpacked) error {
	b, t := u.Bucket, l.target
	m := &b.Meta
	c, err := l.ld.loadCopier(b.Buf)
	if err != nil {
		return err
	}
	direct := b.srcs != nil
	var cb gpu.CopyBatch
	var lay gpu.Layout
	for _, v := range u.Views {
		e := v.Entry
		buf, off, err := t.Target(ctx, e)
		if err != nil {
			return fmt.Errorf("loading tensor %q from bucket %d: %w", e.Name, m.Seq, err)
		}
		if e.Size == 0 {
			continue
		}
		if !sameGPU(buf, b.Buf) {
			return fmt.Errorf("loading tensor %q from bucket %d: the sink's memory is on %s, the buckets on %s; give the receiver a sink on its buckets' GPU", e.Name, m.Seq, buf.Device().Name(), b.Buf.Device().Name())
		}
		to, _ := gpu.Address(buf)
		from, ok := gpu.Address(v.Device)
		if !ok {
			return fmt.Errorf("loading tensor %q from bucket %d: its source is not memory the GPU can address", e.Name, m.Seq)
		}
		to, from = to+uint64(off), from+uint64(v.Offset)
		cb.Add(to, from, e.Size)
		lay.Add(e.Offset, from, e.Size, to)
	}
	var ps *gpu.PendingSum
	switch {
	case u.sumAtLoad && direct:
		ps, err = c.gather.CopySumLayout(ctx, &lay, m.Length, c.sums)
	case u.sumAtLoad:
		ps, err = c.gather.CopySum(ctx, &cb, gpu.SumOf{Buf: gpu.Unfence(b.Buf), N: m.Length, Side: gpu.SumSrc, Sums: c.sums})
	default:
		if err = c.gather.Copy(ctx, &cb); err == nil {
			err = c.sync(ctx)
		}
	}
	var got uint64
	if err == nil && ps != nil {
		got, err = ps.Wait(ctx) // the copies have finished when the sum is in
		ps.Close()
	}
	if err != nil {
		return fmt.Errorf("copying bucket %d into the model: %w", m.Seq, err)
	}
	if err := t.Flush(ctx); err != nil {
		return fmt.Errorf("copying bucket %d into the model: %w", m.Seq, err)
	}
	if u.sumAtLoad {
		return verifySum(m, got)
	}
	return nil
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
	l := &loadRound{ld: ld, sinks: leaves(sink), target: fusedTarget(sink), toHost: ld.toHost}
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
	defer ld.mu.Unlock()
	if failed && ld.loadCopy != nil {
		err, ld.loadCopy = errors.Join(err, ld.loadCopy.close(ctx)), nil
	}
	ld.loadBusy, ld.toHost = false, l.toHost
	ld.lastVersion, ld.lastTensors = l.version, l.tensors
	return err
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
	if ld.maps != nil {
		errs = append(errs, ld.maps.close()) // after every copy out of them
	}
	ld.check, ld.toHost, ld.loadCopy, ld.gathering, ld.maps = nil, nil, nil, nil, nil
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
// the sender's allocations they lie in and, when inPlace (the round's
// sink is one DeviceTarget, which load copies into from there), leaves
// them where they lie (b.srcs); otherwise it gathers them into b's own
// buffer, its checksum computed in the same pass for unpack to check.
func (ld *Loader) receiveDirect(ctx context.Context, b *Bucket, inPlace bool) error {
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
	if !inPlace {
		c, err = copierFor(&ld.gathering, b.Buf)
	}
	ld.mu.Unlock()
	if err != nil {
		return err
	}
	if mp.dev != dev {
		return fmt.Errorf("bucket %d on %s after direct buckets on %s: give every bucket of a receiver one GPU", m.Seq, dev.Name(), mp.dev.Name())
	}
	srcs, err := mp.views(m)
	if err != nil {
		return err
	}
	if inPlace {
		b.srcs = srcs
		return nil
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
}

func newGPUCopier(dev *gpu.CUDADevice) (*gpuCopier, error) {
	s, err := dev.NewStream()
	if err != nil {
		return nil, fmt.Errorf("load: %w", err)
	}
	d := &gpuCopier{dev: dev, stream: s, gather: s.NewGather()}
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
	errs := []error{d.gather.Close(ctx)}
	if d.sums != nil {
		errs = append(errs, d.sums.Close(ctx))
	}
	return errors.Join(append(errs, d.stream.Close())...)
}
