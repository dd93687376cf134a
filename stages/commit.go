package stages

import (
	"context"
	"fmt"
	"strconv"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/blame"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// A round is all or nothing. A receiver loads a round's buckets as they
// come and acknowledges each once its sink has it, but the version counts
// as committed only after the root has every receiver's acknowledgement of
// every bucket and has said so: the commit message, one more message on the
// metadata bus after the round's last bucket (docs/protocol.md, "Commit
// message"). It takes the next sequence number, so the next round's first
// bucket comes one sequence number later.

// AnnounceCommit is the root's commit: it publishes the commit message of
// version as message seq through pub, then waits until every receiver has
// acknowledged it. Call it once the round's last bucket has been published
// and pub.Sync has returned, that is once every receiver has acknowledged
// every bucket of the round; seq is the sequence number after the round's
// last bucket. With keys (the run's, when the group has a secret) the
// message is signed. Sender.Sync does this; a pipeline composed by hand
// calls it itself.
func AnnounceCommit(ctx context.Context, pub transport.Publisher, seq, version uint64, keys *auth.Keys) error {
	if err := pub.Publish(ctx, seq, wire.Seal(keys, seq, wire.EncodeCommit(version))); err != nil {
		return fmt.Errorf("announcing the commit of version %d: %w", version, err)
	}
	if err := pub.Sync(ctx); err != nil {
		return fmt.Errorf("version %d was announced committed, but not every receiver acknowledged the announcement: %w", version, err)
	}
	return nil
}

// AwaitCommit is a receiver's side of the commit: it receives the next
// message from sub, which must be message seq and the commit message of
// version, and acknowledges it. Call it after the round's last bucket was
// loaded and acknowledged; when it returns nil, version is committed on
// every receiver. With keys (the run's, when the group has a secret) the
// message must be signed with them; without, it must not be signed.
// Receiver.Sync does this.
func AwaitCommit(ctx context.Context, sub transport.Subscriber, seq, version uint64, keys *auth.Keys) error {
	msg, err := sub.Recv(ctx)
	if err != nil {
		return fmt.Errorf("waiting for the root to commit version %d: %w", version, err)
	}
	if msg.Seq != seq {
		return fmt.Errorf("expected the commit message of version %d as message %d, got message %d", version, seq, msg.Seq)
	}
	data, err := wire.Open(keys, msg.Seq, msg.Data)
	if err != nil {
		return fmt.Errorf("the commit message of version %d: %w", version, err)
	}
	v, err := wire.DecodeCommit(data)
	switch {
	case err != nil:
		return fmt.Errorf("expected the commit message of version %d after its last bucket (message %d): %w; every rank must run the same protocol", version, seq, err)
	case v != version:
		return fmt.Errorf("the root committed version %d, but this rank received version %d", v, version)
	}
	if err := sub.Ack(ctx, seq); err != nil {
		return fmt.Errorf("acknowledging the commit of version %d: %w", version, err)
	}
	return nil
}

// Committer is implemented by Sinks that act when the whole group has a
// version. Commit tells a sink that this rank has loaded every bucket of a
// round; Committed, which comes after, that every receiver has, so the
// version is the group's. A shadowed sink (HoldsShadowed) switches to its
// new copy here. An error means the sink could not take the committed
// version: the receiver's round fails, and its state is StatePartial.
type Committer interface {
	Committed(ctx context.Context, version uint64) error
}

// SinkState says what a receiver's sink holds after a round.
type SinkState int

const (
	// StateIntact: the sink holds the last committed version unchanged
	// (the round succeeded, failed before loading anything into the
	// sink, or the sink holds rounds in a shadow copy or holds nothing:
	// see Holding).
	StateIntact SinkState = iota
	// StatePartial: a round that did not commit loaded some or all of
	// its bytes into the sink in place, or the sink failed to switch to
	// the committed version. It holds neither the committed version nor,
	// for sure, the new one: resync it with a new round.
	StatePartial
)

// String describes the state for people ("intact", "partial (resync needed)").
func (s SinkState) String() string {
	switch s {
	case StateIntact:
		return "intact"
	case StatePartial:
		return "partial (resync needed)"
	}
	return "SinkState(" + strconv.Itoa(int(s)) + ")"
}

// abortBus ends the metadata bus (a Publisher or Subscriber) after this
// rank's round failed with err: blame.Watch.Abort, watch may be nil.
func abortBus(bus any, err error, watch *blame.Watch) error { return watch.Abort(err, bus) }
