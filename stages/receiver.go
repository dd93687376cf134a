package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/blame"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
)

// ReceiverConfig holds what a receiver needs across rounds.
type ReceiverConfig struct {
	Endpoint   transport.Endpoint
	Subscriber transport.Subscriber
	Pool       *Pool
	Tracer     *pipeline.Tracer
	Rank       int
	// Auth, the run's keys when the group has a secret, has the receiver
	// check every bucket's MAC before its sink sees it and take only
	// messages signed with them (see mac.go); nil: the root must send
	// neither.
	Auth *auth.Keys
	// Blame, when set, is the rank's owner of lost-peer attribution
	// (the front door's): when a round fails on a lost peer
	// (transport.ErrPeerGone), what the bus and its witnesses say is
	// added to the error before the bus is aborted, after a wait of
	// blame.WitnessWait at most for the first word. Nil hears the bus
	// alone.
	Blame *blame.Watch
}

// Receiver is one receiving rank of a sync group. Like Sender, a failed
// round leaves it broken. It owns a Loader, which keeps the GPU state of
// device buckets from round to round; Close frees it. The Pool stays its
// creator's.
//
// A round's version is committed only when the root says every receiver
// has every bucket of it (see AwaitCommit). Committed, WaitCommitted and
// State tell a serving goroutine where the receiver stands; they may be
// called while Sync runs.
type Receiver struct {
	cfg    ReceiverConfig
	loader *Loader
	seq    uint64 // the next message's sequence number
	// gpuLane: the trace's "load (GPU)" lane is named. Used by Sync only.
	gpuLane bool

	mu        sync.Mutex
	committed uint64
	state     SinkState
	broken    error
	changed   chan struct{} // closed and replaced on every commit, and when the receiver breaks
}

// NewReceiver returns a Receiver; it starts and allocates nothing.
func NewReceiver(cfg ReceiverConfig) *Receiver {
	ld := NewLoader()
	ld.rank = cfg.Rank
	return &Receiver{cfg: cfg, loader: ld, changed: make(chan struct{})}
}

// Close frees the GPU state the Receiver kept between rounds (not its
// Pool, Endpoint or Subscriber, which stay their creator's). Call it once
// no Sync runs; Close is idempotent.
func (r *Receiver) Close() error { return r.loader.Close() }

// Sync receives one round into sink and returns its stats; the round's
// model version is stats.Version. It returns nil once the root has
// committed the version on every receiver; then sink's Committed (when it
// is a Committer) has been called, and Committed returns the version.
//
// On an error the version is not committed here, State says whether sink
// still holds the last committed version intact, and the sinks that are
// Aborters have dropped what they kept of the failed round.
func (r *Receiver) Sync(ctx context.Context, sink Sink) (RoundStats, error) {
	r.mu.Lock()
	broken := r.broken
	r.mu.Unlock()
	if broken != nil {
		return RoundStats{}, fmt.Errorf("receiver %w: %w", ErrBroken, broken)
	}
	start := time.Now()
	p := r.pipeline(sink)
	err := p.Run(ctx)
	if err == nil {
		r.traceGPU(p)
	}
	version, tensors := r.loader.loaded()
	stats := RoundStats{Version: version, Tensors: tensors, Stages: p.Metrics(), Graph: p.Graph()}
	for _, m := range stats.Stages {
		switch m.Stage {
		case "subscribe":
			stats.Buckets = int(m.ItemsOut)
		case "load":
			stats.Bytes = m.Bytes
		}
	}
	switched := false // the sink was told to switch and failed: what it holds is unknown
	if err == nil {
		switched, err = r.commit(ctx, sink, r.seq+uint64(stats.Buckets), version)
	}
	stats.Duration = time.Since(start)
	if err != nil && stats.Buckets == 0 && errors.Is(err, transport.ErrEnded) {
		// The root ended the run where this round would have begun:
		// nothing failed, and nothing more will come.
		return stats, r.end(fmt.Errorf("rank %d: no round after version %d: %w", r.cfg.Rank, r.Committed(), err))
	}
	if err != nil {
		// The root fails with this reason, not "rank r left"; nothing of
		// the failed round stays behind in the sink.
		err = abortBus(r.cfg.Subscriber, err, r.cfg.Blame)
		if aerr := abort(leaves(sink)); aerr != nil {
			err = fmt.Errorf("%w; and dropping the failed round from the sink: %w", err, aerr)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.broken = err
		r.state = StateIntact
		if switched || (tensors > 0 && holdingOf(leaves(sink)) == HoldsInPlace) {
			// Loaded in place, or a switch gone wrong: the sink holds
			// some of an uncommitted version.
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
// then tells sink's Committers. switched reports that the failure, if any,
// came from a sink that could not switch to the committed version.
func (r *Receiver) commit(ctx context.Context, sink Sink, seq, version uint64) (switched bool, err error) {
	r.mu.Lock()
	last := r.committed
	r.mu.Unlock()
	if version <= last {
		return false, fmt.Errorf("rank %d: the root sent version %d, which is not above the version committed before, %d", r.cfg.Rank, version, last)
	}
	if err := AwaitCommit(ctx, r.cfg.Subscriber, seq, version, r.cfg.Auth); err != nil {
		return false, fmt.Errorf("rank %d: %w", r.cfg.Rank, err)
	}
	if err := committed(ctx, leaves(sink), version); err != nil {
		return true, fmt.Errorf("rank %d: version %d is committed on the group, but this rank's sink could not switch to it: %w", r.cfg.Rank, version, err)
	}
	return false, nil
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
// subscribe ──► receive ──► unpack ──► load.
func (r *Receiver) pipeline(sink Sink) *pipeline.Pipeline {
	var opts []pipeline.Option
	if r.cfg.Tracer != nil {
		opts = append(opts, pipeline.WithTracer(r.cfg.Tracer, r.cfg.Rank))
	}
	p := pipeline.New(fmt.Sprintf("receive rank %d", r.cfg.Rank), opts...)
	buckets := r.loader.Receive(p, Subscribe(p, r.cfg.Subscriber, r.cfg.Pool, r.seq, r.cfg.Auth), r.cfg.Endpoint, sink)
	r.loader.Load(p, r.loader.Unpack(p, buckets, sink), sink)
	return p
}

// traceGPU adds, to a traced round whose device buckets the load stage
// copied into a DeviceTarget, when the GPU worked on each bucket: spans on
// a lane "load (GPU)" beside load's, whose bytes over duration is the rate
// of the copies and their checksum themselves (load's own spans also hold
// queueing them, waiting for them and acknowledging the bucket).
func (r *Receiver) traceGPU(p *pipeline.Pipeline) {
	gpuLane(r.cfg.Tracer, p, r.cfg.Rank, "load (GPU)", "load", &r.gpuLane, r.loader.gpuSpans())
}

// Graph describes the pipeline each Sync runs.
func (r *Receiver) Graph() pipeline.Graph { return r.pipeline(nil).Graph() }
