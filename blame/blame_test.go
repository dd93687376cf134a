package blame

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeGroup breaks with err when the test closes gone.
type fakeGroup struct {
	gone chan struct{}
	err  error
}

func (g *fakeGroup) PeerGone() <-chan struct{} { return g.gone }
func (g *fakeGroup) Err() error {
	select {
	case <-g.gone:
		return g.err
	default:
		return nil
	}
}

// fakeBus is a bus end that is a transport.Watcher.
type fakeBus struct{ fakeGroup }

func (b *fakeBus) Failed() <-chan struct{} { return b.gone }

// TestRoundGraceIsShared: the rendezvous's word ends a round only after
// the grace, and the grace counts from the first round that saw the loss,
// not again in every round after it.
func TestRoundGraceIsShared(t *testing.T) {
	g := &fakeGroup{gone: make(chan struct{}), err: fmt.Errorf("rank 2 left: %w", transport.ErrPeerGone)}
	w := New(g)
	w.grace = 200 * time.Millisecond
	close(g.gone)
	ctx, cancel := context.WithCancelCause(context.Background())
	start := time.Now()
	stop := w.Round(ctx, cancel)
	<-ctx.Done()
	stop()
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Fatalf("the round ended %v after the loss, before the grace", d)
	}
	if !w.GroupBroke(context.Cause(ctx)) {
		t.Fatalf("cause %v is not the group's", context.Cause(ctx))
	}
	ctx, cancel = context.WithCancelCause(context.Background())
	start = time.Now()
	stop = w.Round(ctx, cancel)
	<-ctx.Done()
	stop()
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("the next round ended %v after it began; the grace had passed", d)
	}
}

// TestRoundBusEndsAtOnce: a bus that fails ends the round at once with
// its word; stop returns without a failure too.
func TestRoundBusEndsAtOnce(t *testing.T) {
	bus := &fakeBus{fakeGroup{gone: make(chan struct{}), err: errors.New("the root gave up")}}
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := (*Watch)(nil).Round(ctx, cancel, bus, nil, "not a bus")
	close(bus.gone)
	<-ctx.Done()
	stop()
	if context.Cause(ctx) != bus.err {
		t.Fatalf("cause %v, want the bus's word", context.Cause(ctx))
	}
	ctx, cancel = context.WithCancelCause(context.Background())
	defer cancel(nil)
	New(&fakeGroup{gone: make(chan struct{})}).Round(ctx, cancel, &fakeBus{fakeGroup{gone: make(chan struct{})}})()
}

// TestMerge: a cause is added once, typed, and not where the error
// already carries it (wrapped, or as a context error's reason).
func TestMerge(t *testing.T) {
	cause := fmt.Errorf("rank 2 left: %w", transport.ErrPeerGone)
	own := errors.New("bucket 3: short read")
	err := Merge(own, cause)
	if err.Error() != "bucket 3: short read (cause: rank 2 left: peer gone)" || !errors.Is(err, own) || !errors.Is(err, transport.ErrPeerGone) {
		t.Fatalf("Merge = %v", err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	said := &transport.Error{Transport: "tcp", Op: "broadcast", Peer: -1, Err: transport.ContextErr(ctx)}
	if got := Merge(said, cause); got != said {
		t.Fatalf("Merge of an error that gives the cause as its context's reason = %v", got)
	}
	if errors.Is(said, transport.ErrPeerGone) {
		t.Fatal("a context error matches the reason it gives; it should match only what it is")
	}
	if got := Merge(fmt.Errorf("wrapped: %w", cause), cause); got.Error() != "wrapped: rank 2 left: peer gone" {
		t.Fatalf("Merge of an error wrapping the cause = %v", got)
	}
	for _, c := range []error{nil, context.Canceled} {
		if got := Merge(own, c); got != own {
			t.Fatalf("Merge(own, %v) = %v", c, got)
		}
	}
}

// TestLostHearsWitnesses: a lost peer waits for a witness's word, adds
// each word once under its name, leaves out what the error already says,
// and blames the ranks the errors name; another failure is left alone.
func TestLostHearsWitnesses(t *testing.T) {
	lost := &transport.Error{Transport: "tcp", Op: "broadcast", Peer: 2, Err: fmt.Errorf("rank 2 closed the connection: %w", transport.ErrPeerGone)}
	bus := &fakeBus{fakeGroup{gone: make(chan struct{}), err: &transport.Error{Transport: "zmq", Op: "recv", Peer: 0, Err: errors.New("the root gave up")}}}
	mute := &fakeGroup{gone: make(chan struct{})}
	close(mute.gone)
	rdv := &fakeGroup{gone: make(chan struct{}), err: errors.New(`record "ranks/2" was deleted`)}
	time.AfterFunc(30*time.Millisecond, func() { close(rdv.gone) })
	time.AfterFunc(60*time.Millisecond, func() { close(bus.gone) })
	w := New(nil, Witness{Name: "a mute one", Failed: mute.PeerGone, Err: mute.Err}, Witness{Name: "the rendezvous", Failed: rdv.PeerGone, Err: rdv.Err})
	err := w.Lost(lost, bus)
	var pl *PeerLost
	if !errors.As(err, &pl) || !errors.Is(err, transport.ErrPeerGone) {
		t.Fatalf("Lost = %v (%T)", err, err)
	}
	if want := lost.Error() + ` (the rendezvous: record "ranks/2" was deleted)`; err.Error() != want && err.Error() != lost.Error()+" (the metadata bus: "+bus.err.Error()+")"+` (the rendezvous: record "ranks/2" was deleted)` {
		t.Fatalf("Lost = %q", err)
	}
	if r := pl.Ranks(); !slices.Contains(r, 2) {
		t.Fatalf("Ranks = %v, want rank 2 among them", r)
	}
	// Heard again, nothing is added twice.
	if again := w.Lost(err, bus); again.Error() != err.Error()+" (the metadata bus: "+bus.err.Error()+")" && again.Error() != err.Error() {
		t.Fatalf("Lost again = %q", again)
	}
	other := errors.New("bucket 3: checksum mismatch")
	if got := w.Lost(other, bus); got != other {
		t.Fatalf("Lost of a failure that is not a lost peer = %v", got)
	}
	if got := (*Watch)(nil).Lost(lost, nil); got != lost {
		t.Fatalf("Lost with no witness = %v", got)
	}
}
