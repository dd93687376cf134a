package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
)

// Subscribe adds a receiver's source stage: it takes each bucket's metadata
// from sub, checks it, takes a buffer from pool for its bytes, and stops
// after the bucket marked IsLast. firstSeq is the Seq the round must start
// at (the receiver's count of buckets so far).
func Subscribe(p *pipeline.Pipeline, sub transport.Subscriber, pool *Pool, firstSeq uint64) *pipeline.Stream[*Bucket] {
	return pipeline.Source(p, "subscribe", 1, func(ctx context.Context, out *pipeline.Output[*Bucket]) error {
		want := firstSeq
		var version uint64
		for index := 0; ; index++ {
			msg, err := sub.Recv(ctx)
			if err != nil {
				return err
			}
			if isCommit(msg.Data) {
				return fmt.Errorf("message %d is a commit message (%s) where the metadata of bucket %d was expected: the root and this rank disagree on where the round ends", msg.Seq, quote(msg.Data), want)
			}
			meta, err := DecodeMeta(msg.Data)
			if err != nil {
				return err
			}
			switch {
			case meta.Seq != msg.Seq || meta.Seq != want:
				return fmt.Errorf("bucket metadata out of order: message %d carries bucket %d, expected bucket %d", msg.Seq, meta.Seq, want)
			case meta.Index != index:
				return fmt.Errorf("bucket %d has index %d in its round, expected %d", meta.Seq, meta.Index, index)
			case index > 0 && meta.Version != version:
				return fmt.Errorf("bucket %d has model version %d in a round of version %d", meta.Seq, meta.Version, version)
			case meta.Length > int64(pool.BufferSize()):
				return fmt.Errorf("bucket %d holds %d bytes but this rank's buckets hold %d; start every rank with the same bucket size", meta.Seq, meta.Length, pool.BufferSize())
			}
			version = meta.Version
			want++
			buf, err := pool.Get(ctx)
			if err != nil {
				return err
			}
			b := pool.Bucket(buf, *meta)
			seq := meta.Seq
			b.Ack = func() error { return sub.Ack(ctx, seq) }
			pipeline.Count(ctx, "buffers held", float64(pool.Held()))
			if err := out.Send(b); err != nil {
				return err
			}
			if meta.IsLast {
				return nil
			}
		}
	})
}

// Receive adds the receiver's transport stage: each bucket's bytes land in
// its buffer through ep before the bucket is passed on.
func Receive(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], ep transport.Endpoint) *pipeline.Stream[*Bucket] {
	return pipeline.Stage(p, "broadcast", in, 1, func(ctx context.Context, in *pipeline.Input[*Bucket], out *pipeline.Output[*Bucket]) error {
		for b := range in.All() {
			span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", b.Meta.Seq), map[string]any{"bucket": b.Meta.Seq, "round": b.Meta.Version, "bytes": b.Meta.Length})
			err := ep.Broadcast(ctx, b.Meta.Seq, b.Buf, int(b.Meta.Length))
			span.End()
			if err != nil {
				b.Release()
				return err
			}
			if err := out.Send(b); err != nil {
				return err
			}
		}
		return in.Err()
	})
}

// View is one entry of a received bucket with its bytes.
type View struct {
	Entry *Entry
	// Data is the entry's bytes inside the bucket buffer: valid only
	// until the bucket is released. Nil for a device bucket.
	Data []byte
	// Device and Offset place the entry's bytes in a device bucket
	// (Device[Offset:Offset+Entry.Size]); Device is nil for host buckets.
	Device mem.Buffer
	Offset int64
}

// Unpacked is a received bucket turned into views of its entries.
type Unpacked struct {
	Bucket *Bucket
	Views  []View
}

// Release gives the bucket's buffer back.
func (u *Unpacked) Release() { u.Bucket.Release() }

// ByteSize is the bucket's filled length.
func (u *Unpacked) ByteSize() int64 { return u.Bucket.Meta.Length }

// Unpack adds the stage that checks each received bucket (its checksum, and
// that chunks of split tensors arrive in order and complete by the end of
// the round, and that no tensor arrives twice) and turns it into views.
func Unpack(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket]) *pipeline.Stream[*Unpacked] {
	return pipeline.Stage(p, "unpack", in, 1, func(ctx context.Context, in *pipeline.Input[*Bucket], out *pipeline.Output[*Unpacked]) error {
		got := map[string]progress{} // each tensor's bytes received so far this round
		for b := range in.All() {
			u, err := unpack(ctx, b, got)
			if err != nil {
				b.Release()
				return err
			}
			if err := out.Send(u); err != nil {
				return err
			}
		}
		return in.Err()
	})
}

// progress counts the bytes of one tensor received so far in a round.
type progress struct{ have, total int64 }

func unpack(ctx context.Context, b *Bucket, got map[string]progress) (*Unpacked, error) {
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", b.Meta.Seq), map[string]any{"bucket": b.Meta.Seq, "round": b.Meta.Version, "bytes": b.Meta.Length})
	defer span.End()
	m := &b.Meta
	host := b.Buf.Host()
	var data []byte // nil for a device bucket: its views are device views
	if host == nil && !onDevice(b.Buf) {
		return nil, fmt.Errorf("unpack: bucket %d is in a buffer on %s that neither the host nor the GPU can address", m.Seq, b.Buf.Device().Name())
	}
	if host != nil {
		data = host[:m.Length]
	}
	// A device bucket's checksum is checked by Load, which stages it to
	// the host (gpu_sink.go).
	if m.HasChecksum && data != nil {
		if sum := checksum.SumParallel(data); sum != m.Checksum {
			return nil, fmt.Errorf("bucket %d (version %d, %d bytes) failed its checksum: got %x, root sent %x; tensors in it: %s",
				m.Seq, m.Version, m.Length, sum, m.Checksum, entryNames(m.Entries, 8))
		}
	}
	u := &Unpacked{Bucket: b, Views: make([]View, len(m.Entries))}
	for i := range m.Entries {
		e := &m.Entries[i]
		pr, seen := got[e.Name]
		have := pr.have
		switch {
		case seen && have == pr.total:
			return nil, fmt.Errorf("tensor %q arrived twice in round %d (again in bucket %d)", e.Name, m.Version, m.Seq)
		case e.Chunk != have:
			return nil, fmt.Errorf("tensor %q: bucket %d carries bytes [%d, %d) but %d bytes had arrived; chunks out of order", e.Name, m.Seq, e.Chunk, e.Chunk+e.Size, have)
		case !seen && len(got) >= maxTensors:
			return nil, fmt.Errorf("round %d carries more than %d tensors (bucket %d); the limit keeps a receiver's bookkeeping bounded", m.Version, maxTensors, m.Seq)
		}
		got[e.Name] = progress{have + e.Size, e.Total}
		if data != nil {
			u.Views[i] = View{Entry: e, Data: data[e.Offset : e.Offset+e.Size]}
		} else {
			u.Views[i] = View{Entry: e, Device: b.Buf, Offset: e.Offset}
		}
	}
	if m.IsLast {
		for name, pr := range got {
			if pr.have != pr.total {
				return nil, fmt.Errorf("round %d ended with tensor %q incomplete (%d of %d bytes)", m.Version, name, pr.have, pr.total)
			}
		}
	}
	return u, nil
}

func entryNames(es []Entry, limit int) string {
	s := ""
	for i, e := range es {
		if i == limit {
			return s + fmt.Sprintf(" and %d more", len(es)-limit)
		}
		if i > 0 {
			s += ", "
		}
		s += e.Name
	}
	return s
}

// Sink is where a receiver puts what it received.
type Sink interface {
	// Load takes one entry: a whole tensor, or one chunk of a tensor
	// larger than a bucket (chunks come in order). data is valid only
	// during the call.
	Load(ctx context.Context, e *Entry, data []byte) error
	// Commit is called once the last bucket of a round has been loaded,
	// with the round's model version, before this rank acknowledges that
	// bucket: an error fails the round on every rank. The version is not
	// committed yet (other receivers may still fail); Committer's
	// Committed says when it is.
	Commit(ctx context.Context, version uint64) error
}

// Load adds a receiver's last stage: it hands every view to sink, commits
// the round after its last bucket, then acknowledges and releases each
// bucket.
func Load(p *pipeline.Pipeline, in *pipeline.Stream[*Unpacked], sink Sink) {
	loadFrom(p, in, sink, nil)
}

// loadFrom is Load taking the staging memory that device buckets need (a
// pinned bucket for host sinks, the GPU checksum's) from pool, and giving
// it back after the round, so that a Receiver's rounds allocate it once.
// With a nil pool each call has its own.
func loadFrom(p *pipeline.Pipeline, in *pipeline.Stream[*Unpacked], sink Sink, pool *Pool) {
	pipeline.Sink(p, "load", in, func(ctx context.Context, in *pipeline.Input[*Unpacked]) (err error) {
		st := pool.takeStaging()
		defer func() { err = errors.Join(err, pool.keepStaging(ctx, st)) }()
		for u := range in.All() {
			if err := loadVia(ctx, u, sink, st); err != nil {
				u.Release()
				return err
			}
			u.Release()
			pipeline.CountBytes(ctx, u.Bucket.Meta.Length)
		}
		return in.Err()
	})
}

func load(ctx context.Context, u *Unpacked, sink Sink) error {
	st := &hostStaging{}
	return errors.Join(loadVia(ctx, u, sink, st), st.close(ctx))
}

// loadVia is load with the staging memory that device buckets need for
// host sinks.
func loadVia(ctx context.Context, u *Unpacked, sink Sink, st *hostStaging) error {
	m := &u.Bucket.Meta
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", m.Seq), map[string]any{"bucket": m.Seq, "round": m.Version, "bytes": m.Length})
	defer span.End()
	if b, ok := sink.(Beginner); ok && m.Index == 0 {
		if err := b.Begin(ctx, m.Version, m.Source); err != nil {
			return fmt.Errorf("starting version %d: %w", m.Version, err)
		}
	}
	if onDevice(u.Bucket.Buf) {
		if err := loadDeviceViews(ctx, u, sink, st); err != nil {
			return err
		}
	} else {
		for _, v := range u.Views {
			if err := sink.Load(ctx, v.Entry, v.Data); err != nil {
				return fmt.Errorf("loading tensor %q from bucket %d: %w", v.Entry.Name, m.Seq, err)
			}
		}
		if ds, ok := asDeviceSink(sink); ok {
			// Host bytes copied to the GPU: done before release.
			if err := ds.Flush(ctx); err != nil {
				return fmt.Errorf("copying bucket %d into the model: %w", m.Seq, err)
			}
		}
	}
	if m.IsLast {
		if err := sink.Commit(ctx, m.Version); err != nil {
			return fmt.Errorf("committing version %d: %w", m.Version, err)
		}
	}
	if u.Bucket.Ack != nil {
		return u.Bucket.Ack()
	}
	return nil
}

// ReceiverConfig holds what a receiver needs across rounds.
type ReceiverConfig struct {
	Endpoint   transport.Endpoint
	Subscriber transport.Subscriber
	Pool       *Pool
	Tracer     *pipeline.Tracer
	Rank       int
}

// Receiver is one receiving rank of a sync group. Like Sender, a failed
// round leaves it broken.
//
// A round's version is committed only when the root says every receiver
// has every bucket of it (see AwaitCommit). Committed, WaitCommitted and
// State tell a serving goroutine where the receiver stands; they may be
// called while Sync runs.
type Receiver struct {
	cfg ReceiverConfig
	seq uint64 // the next message's sequence number

	mu        sync.Mutex
	committed uint64
	state     SinkState
	broken    error
	changed   chan struct{} // closed and replaced on every commit, and when the receiver breaks
}

// NewReceiver returns a Receiver; it starts nothing.
func NewReceiver(cfg ReceiverConfig) *Receiver {
	return &Receiver{cfg: cfg, changed: make(chan struct{})}
}

// Sync receives one round into sink and returns its stats; the round's
// model version is stats.Version. It returns nil once the root has
// committed the version on every receiver; then sink's Committed (when it
// is a Committer) has been called, and Committed returns the version.
//
// On an error the version is not committed here, and State says whether
// sink still holds the last committed version intact.
func (r *Receiver) Sync(ctx context.Context, sink Sink) (RoundStats, error) {
	r.mu.Lock()
	broken := r.broken
	r.mu.Unlock()
	if broken != nil {
		return RoundStats{}, fmt.Errorf("receiver %w: %w", ErrBroken, broken)
	}
	start := time.Now()
	var version uint64
	vs := &versionSink{Sink: sink, version: &version}
	p := r.pipeline(vs)
	err := p.Run(ctx)
	stats := RoundStats{Version: version, Stages: p.Metrics(), Graph: p.Graph()}
	for _, m := range stats.Stages {
		switch m.Stage {
		case "subscribe":
			stats.Buckets = int(m.ItemsOut)
		case "load":
			stats.Bytes = m.Bytes
		}
	}
	stats.Tensors = vs.tensors
	if err == nil {
		err = r.commit(ctx, sink, r.seq+uint64(stats.Buckets), version)
	}
	stats.Duration = time.Since(start)
	if err != nil && stats.Buckets == 0 && errors.Is(err, transport.ErrEnded) {
		// The root ended the run where this round would have begun:
		// nothing failed, and nothing more will come.
		err = r.end(fmt.Errorf("rank %d: no round after version %d: %w", r.cfg.Rank, r.Committed(), err))
		return stats, err
	}
	if a, ok := r.cfg.Subscriber.(transport.Aborter); ok && err != nil {
		a.Abort(err) // the root fails with this reason, not "rank r left"
	}
	if a, ok := sink.(Aborter); ok && err != nil {
		if aerr := a.Abort(); aerr != nil { // nothing of the failed round stays behind
			err = fmt.Errorf("%w; and then: %w", err, aerr)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.broken = err
		r.state = StateIntact
		if staged, ok := sink.(Stager); (!ok || !staged.Staged()) && vs.tensors > 0 {
			// Loaded in place: the sink holds some of an uncommitted
			// version.
			r.state = StatePartial
		}
		r.wakeLocked()
		return stats, err
	}
	r.seq += uint64(stats.Buckets) + 1 // the buckets and the commit message
	r.committed, r.state = version, StateIntact
	r.wakeLocked()
	return stats, nil
}

// end records the end of the run (err wraps transport.ErrEnded):
// every later Sync returns it, the sink keeps the committed version.
func (r *Receiver) end(err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.broken, r.state = err, StateIntact
	r.wakeLocked()
	return err
}

// AwaitEnd waits for the root to end the run (docs/protocol.md, "End of a
// run"): call it after the last round a receiver expects. It returns nil
// when the root closes the metadata bus with every message acknowledged.
// It fails when the root sends another round instead (the receiver is
// then broken), and when the bus fails.
func (r *Receiver) AwaitEnd(ctx context.Context) error {
	r.mu.Lock()
	broken, committed := r.broken, r.committed
	r.mu.Unlock()
	if broken != nil {
		if errors.Is(broken, transport.ErrEnded) {
			return nil
		}
		return fmt.Errorf("receiver %w: %w", ErrBroken, broken)
	}
	msg, err := r.cfg.Subscriber.Recv(ctx)
	switch {
	case err == nil:
		err = fmt.Errorf("rank %d: expected the end of the run after version %d, but the root sent message %d (another round)", r.cfg.Rank, committed, msg.Seq)
	case errors.Is(err, transport.ErrEnded):
		r.end(fmt.Errorf("rank %d: no round after version %d: %w", r.cfg.Rank, committed, err))
		return nil
	default:
		err = fmt.Errorf("rank %d: waiting for the end of the run after version %d: %w", r.cfg.Rank, committed, err)
	}
	if a, ok := r.cfg.Subscriber.(transport.Aborter); ok {
		a.Abort(err) // the root learns why this rank stopped
	}
	r.mu.Lock()
	r.broken = err
	r.wakeLocked()
	r.mu.Unlock()
	return err
}

// commit waits for the root's commit message of version (message seq),
// then tells sink.
func (r *Receiver) commit(ctx context.Context, sink Sink, seq, version uint64) error {
	r.mu.Lock()
	last := r.committed
	r.mu.Unlock()
	if version <= last {
		return fmt.Errorf("rank %d: the root sent version %d, which is not above the version committed before, %d", r.cfg.Rank, version, last)
	}
	if err := AwaitCommit(ctx, r.cfg.Subscriber, seq, version); err != nil {
		return fmt.Errorf("rank %d: %w", r.cfg.Rank, err)
	}
	if c, ok := sink.(Committer); ok {
		if err := c.Committed(ctx, version); err != nil {
			return fmt.Errorf("rank %d: version %d is committed on the group, but this rank's sink could not switch to it: %w", r.cfg.Rank, version, err)
		}
	}
	return nil
}

func (r *Receiver) wakeLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Committed returns the last version committed on every receiver that
// this receiver has loaded into its sink, or 0 before the first.
func (r *Receiver) Committed() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.committed
}

// State says what the sink of the last round holds: StateIntact while
// rounds succeed, and after a failed round whether the sink still holds
// the version Committed returns.
func (r *Receiver) State() SinkState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// WaitCommitted blocks until version v or a later one is committed and
// returns the committed version; WaitCommitted(ctx, r.Committed()+1)
// waits for the next one. It returns early with ctx's cause when ctx
// ends, and with an error wrapping ErrBroken and the round's failure when
// a round fails before v is committed (the receiver will commit nothing
// more: resync into a new one).
func (r *Receiver) WaitCommitted(ctx context.Context, v uint64) (uint64, error) {
	for {
		r.mu.Lock()
		committed, broken, changed := r.committed, r.broken, r.changed
		r.mu.Unlock()
		switch {
		case committed >= v:
			return committed, nil
		case broken != nil:
			return committed, fmt.Errorf("rank %d: waiting for version %d: receiver %w at version %d: %w", r.cfg.Rank, v, ErrBroken, committed, broken)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return committed, fmt.Errorf("rank %d: waiting for version %d (committed: %d): %w", r.cfg.Rank, v, committed, context.Cause(ctx))
		}
	}
}

// pipeline builds one round's pipeline:
// subscribe ──► broadcast ──► unpack ──► load.
func (r *Receiver) pipeline(sink Sink) *pipeline.Pipeline {
	var opts []pipeline.Option
	if r.cfg.Tracer != nil {
		opts = append(opts, pipeline.WithTracer(r.cfg.Tracer, r.cfg.Rank))
	}
	p := pipeline.New(fmt.Sprintf("receive rank %d", r.cfg.Rank), opts...)
	loadFrom(p, Unpack(p, Receive(p, Subscribe(p, r.cfg.Subscriber, r.cfg.Pool, r.seq), r.cfg.Endpoint)), sink, r.cfg.Pool)
	return p
}

// Graph describes the pipeline each Sync runs.
func (r *Receiver) Graph() pipeline.Graph { return r.pipeline(nil).Graph() }

// versionSink notes the committed version and counts tensors.
type versionSink struct {
	Sink
	version *uint64
	tensors int
}

func (v *versionSink) Load(ctx context.Context, e *Entry, data []byte) error {
	if e.Chunk == 0 {
		v.tensors++
	}
	return v.Sink.Load(ctx, e, data)
}

func (v *versionSink) Begin(ctx context.Context, version uint64, info *SourceInfo) error {
	if b, ok := v.Sink.(Beginner); ok {
		return b.Begin(ctx, version, info)
	}
	return nil
}

func (v *versionSink) Commit(ctx context.Context, version uint64) error {
	*v.version = version
	return v.Sink.Commit(ctx, version)
}
