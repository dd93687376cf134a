package weightcast

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/route"
	"github.com/weightcast/weightcast/stages"
)

// Receiver is one of ranks 1..WorldSize-1 of a group: it receives every
// round.
type Receiver struct {
	*member
	r  *stages.Receiver
	rr *route.Receiver // a routed group's, in place of r
}

// OpenReceiver makes this process rank o.Rank (1 or more) of the group o
// describes and returns once every rank has joined and the bus and
// transport are open.
func OpenReceiver(ctx context.Context, o Options) (*Receiver, error) {
	m, err := open(ctx, o, "receiver")
	if err != nil {
		return nil, err
	}
	r := &Receiver{member: m}
	if o.Senders > 0 {
		if r.rr, err = route.NewReceiver(m.routeConfig(), m.opts.need()); err != nil {
			m.Close()
			return nil, fmt.Errorf("%w: %s: %w", ErrConfig, m.who(), err)
		}
		m.extra = append(m.extra, r.rr.Close)
		return r, nil
	}
	r.r = stages.NewReceiver(stages.ReceiverConfig{Endpoint: m.endpoint, Subscriber: m.sub, Pool: m.pool, Auth: m.keys, Tracer: m.opts.Tracer, Rank: m.opts.Rank, Blame: m.blame})
	m.extra = append(m.extra, r.r.Close) // its GPU state, before the pool
	return r, nil
}

// Receive receives one round into sink and returns once the sender has
// committed its version on every receiver (stats.Version). A sink.Views
// sink hands the round over bucket by bucket. A failed round fails on
// every rank and leaves the Receiver broken; State then says what sink
// holds.
func (r *Receiver) Receive(ctx context.Context, sink stages.Sink) (stages.RoundStats, error) {
	var st stages.RoundStats
	if r.rr != nil {
		return st, r.errRouted("Receive")
	}
	err := r.round(ctx, func(ctx context.Context) error {
		var err error
		st, err = r.r.Sync(ctx, sink)
		return err
	})
	if err != nil {
		err = fmt.Errorf("%s: %w", r.who(), err)
	}
	return st, err
}

// AwaitEnd waits, after the last round this receiver expects, for the
// sender to end the run (its Close: docs/protocol.md, "End of a run"). It
// fails when the sender starts another round instead, or the bus fails.
// Optional: a receiver may also just close.
func (r *Receiver) AwaitEnd(ctx context.Context) error {
	if r.rr != nil {
		return r.errRouted("AwaitEnd")
	}
	var err error
	if rerr := r.round(ctx, func(ctx context.Context) error { err = r.r.AwaitEnd(ctx); return err }); rerr != nil {
		return fmt.Errorf("%s: %w", r.who(), rerr)
	}
	return nil
}

// Committed is the last version committed on every receiver that this
// one loaded, or 0.
func (r *Receiver) Committed() uint64 {
	if r.rr != nil {
		return r.rr.Committed()
	}
	return r.r.Committed()
}

// State says what the sink of the last round holds: intact, or partial
// after a round that failed while loading in place.
func (r *Receiver) State() stages.SinkState {
	if r.rr != nil {
		return stages.StateIntact // a routed group's Dest says what it holds (route.Shards keeps the committed version whole)
	}
	return r.r.State()
}
