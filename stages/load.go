package stages

import (
	"context"
	"errors"
	"fmt"

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
//     its own. While a bucket's copies run, Load queues the next bucket's
//     as soon as it arrives (loader.go, queuedLoad), so that the GPU goes
//     from bucket to bucket without waiting for the host;
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
		// queued are the buckets whose copies into a DeviceTarget run
		// on the GPU, oldest first. While one runs, the loop queues
		// each next bucket as it arrives and lands (waits for, checks
		// and acknowledges) the oldest once its copies are done, so
		// that the GPU goes from bucket to bucket without waiting for
		// the host; it never waits only for a bucket to arrive while
		// one is on the GPU, because the root may hold the next one
		// back until it has this one's acknowledgement.
		var queued []*queuedLoad
		land := func() error {
			q := queued[0]
			queued = queued[1:]
			return l.release(ctx, q.u, l.land(ctx, q))
		}
		defer func() {
			if err != nil {
				// Every wait of the round's turns ends, this rank's
				// too, before the copies behind them are waited for.
				err = errors.Join(err, ld.releaseTurns(&l.turns))
			}
			for _, q := range queued { // the round has failed: their copies are only waited for
				l.release(ctx, q.u, errors.Join(err, q.wait(ctx)))
			}
		}()
		for {
			var u *Unpacked
			var ok bool
			if len(queued) == 0 {
				u, ok = in.Recv()
			} else {
				// Whichever comes first: the next bucket, or the end
				// of the oldest one's copies.
				arrived := false
				err := gpu.Poll(ctx, func() (bool, error) {
					if u, ok, arrived = in.TryRecv(); arrived {
						return true, nil
					}
					return queued[0].done.Query()
				})
				if err != nil {
					return fmt.Errorf("copying bucket %d into the model: %w", queued[0].u.Bucket.Meta.Seq, err)
				}
				if !arrived {
					if err := land(); err != nil {
						return err
					}
					continue
				}
			}
			if !ok {
				break
			}
			if len(queued) > 0 && !l.queues(u) { // their copies came first
				for len(queued) > 0 {
					if err := land(); err != nil {
						return l.release(ctx, u, err)
					}
				}
			}
			q, err := l.deliver(ctx, u)
			switch {
			case err != nil:
				return l.release(ctx, u, err)
			case q == nil: // delivered
				l.release(ctx, u, nil)
			default:
				queued = append(queued, q)
			}
		}
		if err := in.Err(); err != nil {
			return err
		}
		// The round's last bucket ended its group; should it not have,
		// the next rank is let go before this one waits for its copies.
		if err := l.turns.pass(); err != nil {
			return err
		}
		for len(queued) > 0 {
			if err := land(); err != nil {
				return err
			}
		}
		return nil
	})
}

// release releases bucket u, which err (when not nil) failed to deliver,
// failing the round first, and returns err.
func (l *loadRound) release(ctx context.Context, u *Unpacked, err error) error {
	u.Bucket.delivered = err == nil
	pipeline.Fail(ctx, err) // before a lent bucket's release tells the root
	u.Release()
	if err == nil {
		pipeline.CountBytes(ctx, u.Bucket.Meta.Length)
	}
	return err
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
	// turns is this rank's part in the round's turns (turns.go).
	turns roundTurns
}

// deliver hands u's views to the sinks, then commits the round after its
// last bucket and acknowledges the bucket; or, where the round's one sink
// is a DeviceTarget, queues the copies of device bucket u into it and
// returns them, for land to finish.
func (l *loadRound) deliver(ctx context.Context, u *Unpacked) (*queuedLoad, error) {
	m := &u.Bucket.Meta
	queue := l.queues(u)
	name := fmt.Sprintf("bucket %d", m.Seq)
	args := map[string]any{"bucket": m.Seq, "round": m.Version, "bytes": m.Length}
	if queue {
		// The GPU does the copies later: see load (GPU).
		name += " (queued)"
		delete(args, "bytes")
	}
	span := pipeline.StartSpan(ctx, name, args)
	defer span.End()
	l.version = m.Version
	if m.Index == 0 {
		if err := begin(ctx, l.sinks, m.Version, m.Source); err != nil {
			return nil, fmt.Errorf("starting version %d: %w", m.Version, err)
		}
	}
	// The tensors reach the sinks from here on: a failure now leaves an
	// in-place sink partial (Receiver.State).
	for _, v := range u.Views {
		if v.Entry.Chunk == 0 {
			l.tensors++
		}
	}
	if queue {
		return l.queueTarget(ctx, u, span != nil)
	}
	return nil, l.deliverNow(ctx, u)
}

// queues reports whether deliver queues u's copies rather than deliver
// it: u is a device bucket and the round's one sink a DeviceTarget.
func (l *loadRound) queues(u *Unpacked) bool { return l.target != nil && onDevice(u.Bucket.Buf) }

// deliverNow hands u's views to the sinks, then commits the round after
// its last bucket and acknowledges the bucket.
func (l *loadRound) deliverNow(ctx context.Context, u *Unpacked) error {
	m := &u.Bucket.Meta
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
