package stages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/blame"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// gatedPublisher holds the commit message back until the test opens gate,
// so the test can look at the receivers between a round's last bucket and
// its commit.
type gatedPublisher struct {
	transport.Publisher
	held chan uint64   // receives the version of each commit held back
	gate chan struct{} // one value lets one commit through
}

func (g *gatedPublisher) Publish(ctx context.Context, seq uint64, msg []byte) error {
	if v, err := wire.DecodeCommit(msg); err == nil {
		g.held <- v
		select {
		case <-g.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Publisher.Publish(ctx, seq, msg)
}

// roundModel is the model of one round: the same layout every round, new
// bytes.
func roundModel(t testing.TB, version uint64) *genModel {
	t.Helper()
	return synthetic(t, 1<<20, 22, version, dtype.BF16, dtype.F32)
}

// sameAs reports the first tensor of want whose bytes h does not serve.
func sameAs(h *memModel, want *genModel) error {
	for _, w := range want.List() {
		got, ok := h.Get(w.Name)
		if !ok {
			return fmt.Errorf("tensor %s missing", w.Name)
		}
		exp := make([]byte, len(got.Data))
		if err := w.ReadAt(exp, 0); err != nil {
			return err
		}
		if !bytes.Equal(got.Data, exp) {
			return fmt.Errorf("tensor %s differs", w.Name)
		}
	}
	return nil
}

// TestCommitFlow: three receivers, several rounds. Between a round's last
// bucket and the commit message every receiver still reports the previous
// version (and a shadowed model still serves it); after the commit every
// receiver reports the new one, and a waiter wakes.
func TestCommitFlow(t *testing.T) {
	g := newGroup(t, groupOpts{world: 4, bucket: 64 << 10, checksum: true})
	gate := &gatedPublisher{Publisher: g.sender.cfg.Publisher, held: make(chan uint64), gate: make(chan struct{})}
	g.sender.cfg.Publisher = gate
	models := []*memModel{newShadowModel(), newMemModel(), newShadowModel()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var lastSeq uint64
	for version := uint64(1); version <= 5; version++ {
		model := roundModel(t, version)
		woke := make(chan uint64, 1)
		go func() {
			v, err := g.receivers[2].WaitCommitted(ctx, version)
			if err != nil {
				t.Error(err)
			}
			woke <- v
		}()
		errs := make([]error, 4)
		var st RoundStats
		var wg sync.WaitGroup
		wg.Go(func() { st, errs[0] = g.sender.Sync(ctx, model, version) })
		for i, r := range g.receivers {
			wg.Go(func() { _, errs[i+1] = r.Sync(ctx, models[i]) })
		}
		if v := <-gate.held; v != version {
			t.Fatalf("the root announced version %d in round %d", v, version)
		}
		// Every receiver has acknowledged every bucket; nothing is
		// committed yet.
		for i, r := range g.receivers {
			if c := r.Committed(); c != version-1 {
				t.Errorf("round %d before the commit: rank %d reports version %d committed", version, i+1, c)
			}
		}
		if c := g.sender.Committed(); c != version-1 {
			t.Errorf("round %d before the commit: the root reports version %d committed", version, c)
		}
		for _, i := range []int{0, 2} {
			if v := models[i].Version(); v != version-1 {
				t.Errorf("round %d before the commit: rank %d's shadowed model serves version %d", version, i+1, v)
			}
			if version > 1 {
				if err := sameAs(models[i], roundModel(t, version-1)); err != nil {
					t.Errorf("round %d before the commit: rank %d's shadowed model: %v", version, i+1, err)
				}
			}
		}
		select {
		case v := <-woke:
			t.Fatalf("WaitCommitted returned %d before the commit", v)
		default:
		}
		gate.gate <- struct{}{}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		select {
		case v := <-woke:
			if v != version {
				t.Fatalf("WaitCommitted woke with version %d, want %d", v, version)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("WaitCommitted did not wake on the commit")
		}
		for i, r := range g.receivers {
			if c, s := r.Committed(), r.State(); c != version || s != StateIntact {
				t.Errorf("round %d: rank %d reports version %d committed, state %v", version, i+1, c, s)
			}
			if v := models[i].Version(); v != version {
				t.Errorf("round %d: rank %d's model serves version %d", version, i+1, v)
			}
			if err := sameAs(models[i], model); err != nil {
				t.Errorf("round %d: rank %d: %v", version, i+1, err)
			}
		}
		// The commit consumed one sequence number: the next round's
		// buckets start after it.
		if g.sender.seq != lastSeq+uint64(st.Buckets)+1 {
			t.Errorf("round %d of %d buckets moved the root from message %d to %d", version, st.Buckets, lastSeq, g.sender.seq)
		}
		lastSeq = g.sender.seq
		for i, r := range g.receivers {
			if r.seq != g.sender.seq {
				t.Errorf("rank %d expects message %d next, the root sends %d", i+1, r.seq, g.sender.seq)
			}
		}
	}
	// Steady rounds update in place. (That a shadowed sink.HostModel
	// reuses its two copies is sink's TestShadowServesThroughRounds.)
	n := len(roundModel(t, 1).List())
	if a := models[1].Allocations(); a != n {
		t.Errorf("the model updated in place allocated %d tensors over 5 rounds of %d", a, n)
	}
	if _, err := g.sender.Sync(ctx, roundModel(t, 5), 5); err == nil || !strings.Contains(err.Error(), "not above the last committed version 5") {
		t.Fatalf("a round reusing a committed version: %v", err)
	}
}

// failCommit is a memModel whose Commit (this rank has the whole round)
// fails when fail is set.
type failCommit struct {
	*memModel
	fail bool
}

func (f *failCommit) Commit(ctx context.Context, version uint64) error {
	if f.fail {
		return errInjected
	}
	return f.memModel.Commit(ctx, version)
}

// commitGroup is a faulty group that ran version 1 successfully into the
// given sinks.
func commitGroup(t *testing.T, fault groupFault, sinks []Sink) (*faultyGroup, RoundStats) {
	t.Helper()
	g := newFaultyGroup(t, len(sinks)+1, 64<<10, fault)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var st RoundStats
	errs := make([]error, len(sinks)+1)
	var wg sync.WaitGroup
	wg.Go(func() { st, errs[0] = g.sender.Sync(ctx, roundModel(t, 1), 1) })
	for i, r := range g.receivers {
		wg.Go(func() { _, errs[i+1] = r.Sync(ctx, sinks[i]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return g, st
}

// failedRound runs a round that fails; every rank whose Sync fails closes
// its links, as a failed process's would close on exit.
func (g *faultyGroup) failedRound(t *testing.T, version uint64, sinks []Sink) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, len(g.receivers)+1)
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, errs[0] = g.sender.Sync(ctx, roundModel(t, version), version); errs[0] != nil {
			g.sender.cfg.Endpoint.Close()
			g.sender.cfg.Publisher.Close()
		}
	})
	for i, r := range g.receivers {
		wg.Go(func() {
			if _, errs[i+1] = r.Sync(ctx, sinks[i]); errs[i+1] != nil {
				r.cfg.Endpoint.Close()
				r.cfg.Subscriber.Close()
			}
		})
	}
	wg.Wait()
	if errs[0] == nil {
		t.Fatal("the root reported success")
	}
	return errs
}

// TestFailedRoundNotCommitted: when one receiver cannot finish a round
// (here its sink fails after loading every bucket), no receiver reports
// the version committed; receivers that loaded in place say they need a
// resync, shadowed ones still serve the previous version byte for byte.
func TestFailedRoundNotCommitted(t *testing.T) {
	bad := &failCommit{memModel: newMemModel()}
	inPlace, shadow := newMemModel(), newShadowModel()
	sinks := []Sink{bad, inPlace, shadow}
	g, _ := commitGroup(t, groupFault{}, sinks)
	waited := make(chan error, 1)
	go func() {
		_, err := g.receivers[2].WaitCommitted(context.Background(), 2)
		waited <- err
	}()
	bad.fail = true
	errs := g.failedRound(t, 2, sinks)
	for i, r := range g.receivers {
		if errs[i+1] == nil {
			t.Errorf("rank %d reported success", i+1)
		}
		if c := r.Committed(); c != 1 {
			t.Errorf("rank %d reports version %d committed, want 1", i+1, c)
		}
	}
	if !strings.Contains(errs[1].Error(), errInjected.Error()) {
		t.Errorf("the failing rank's error does not name the cause: %v", errs[1])
	}
	for i, want := range []SinkState{StatePartial, StatePartial, StateIntact} {
		if s := g.receivers[i].State(); s != want {
			t.Errorf("rank %d: state %v, want %v", i+1, s, want)
		}
	}
	if shadow.Version() != 1 {
		t.Errorf("the shadowed model serves version %d", shadow.Version())
	}
	if err := sameAs(shadow, roundModel(t, 1)); err != nil {
		t.Errorf("the shadowed model after the failed round: %v", err)
	}
	// The in-place model holds all of version 2, which was never
	// committed: it says so by its version, the receiver by its state.
	if inPlace.Version() != 2 || g.receivers[1].Committed() != 1 {
		t.Errorf("in place: model at %d, receiver committed %d", inPlace.Version(), g.receivers[1].Committed())
	}
	select {
	case err := <-waited:
		if !errors.Is(err, ErrBroken) || !strings.Contains(err.Error(), "waiting for version 2") {
			t.Errorf("WaitCommitted on a failed receiver: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitCommitted did not return when the round failed")
	}
}

// TestFailedRoundState injects failures at chosen buckets of round 2 and
// checks what each receiver says about its sink.
func TestFailedRoundState(t *testing.T) {
	cases := []struct {
		name  string
		index int // bucket of round 2 (from 0) where rank 1 fails
		flip  bool
		// states of ranks 1..3 (in place, in place, shadow); -1: either
		want [3]SinkState
	}{
		// Rank 1 fails on the first bucket's bytes, before loading
		// anything; the others may or may not have loaded it.
		{"first-bucket", 0, false, [3]SinkState{StateIntact, -1, StateIntact}},
		// A bit flip in bucket 2: the root published bucket 2 only
		// after every receiver loaded bucket 0.
		{"mid-round-checksum", 2, true, [3]SinkState{StatePartial, StatePartial, StateIntact}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fe := &faultyEndpoint{seq: math.MaxUint64, corrupt: c.flip}
			sinks := []Sink{newMemModel(), newMemModel(), newShadowModel()}
			g, st := commitGroup(t, groupFault{ep: map[int]*faultyEndpoint{1: fe}}, sinks)
			if st.Buckets < 4 {
				t.Fatalf("round 1 took %d buckets; the test needs more", st.Buckets)
			}
			fe.seq = uint64(st.Buckets) + 1 + uint64(c.index) // after round 1's buckets and its commit
			errs := g.failedRound(t, 2, sinks)
			for i, r := range g.receivers {
				if errs[i+1] == nil {
					t.Errorf("rank %d reported success", i+1)
				}
				if r.Committed() != 1 {
					t.Errorf("rank %d reports version %d committed", i+1, r.Committed())
				}
				if want := c.want[i]; want >= 0 && r.State() != want {
					t.Errorf("rank %d: state %v, want %v", i+1, r.State(), want)
				}
			}
			if err := sameAs(sinks[2].(*memModel), roundModel(t, 1)); err != nil {
				t.Errorf("the shadowed model: %v", err)
			}
			if c.index == 0 {
				if err := sameAs(sinks[0].(*memModel), roundModel(t, 1)); err != nil {
					t.Errorf("rank 1 says intact: %v", err)
				}
			}
		})
	}
}

// TestCommitLostOnOneReceiver: a receiver that misses the commit message
// does not report the version committed (it holds all of it in place: a
// resync is needed), and the root's error says the announcement was not
// acknowledged everywhere.
func TestCommitLostOnOneReceiver(t *testing.T) {
	fs := &faultySubscriber{seq: math.MaxUint64}
	sinks := []Sink{newMemModel(), newMemModel()}
	g, st := commitGroup(t, groupFault{sub: map[int]*faultySubscriber{1: fs}}, sinks)
	fs.seq = 2*uint64(st.Buckets) + 1 // round 2's commit message
	errs := g.failedRound(t, 2, sinks)
	if !strings.Contains(errs[0].Error(), "not every receiver acknowledged") {
		t.Errorf("root: %v", errs[0])
	}
	if r := g.receivers[0]; errs[1] == nil || r.Committed() != 1 || r.State() != StatePartial {
		t.Errorf("rank 1: committed %d, state %v, err %v", r.Committed(), r.State(), errs[1])
	}
}

// TestWaitCommittedCancel: WaitCommitted returns at once for a version
// already committed, and with the context's cause when cancelled.
func TestWaitCommittedCancel(t *testing.T) {
	r := NewReceiver(ReceiverConfig{Rank: 3})
	if v, err := r.WaitCommitted(context.Background(), 0); v != 0 || err != nil {
		t.Fatalf("WaitCommitted(0) = %d, %v", v, err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(50*time.Millisecond, func() { cancel(errors.New("server shutting down")) })
	start := time.Now()
	_, err := r.WaitCommitted(ctx, 1)
	if err == nil || !strings.Contains(err.Error(), "server shutting down") || !strings.Contains(err.Error(), "rank 3") {
		t.Fatalf("cancelled WaitCommitted: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("cancellation took %v", d)
	}
}

// scriptedSubscriber hands out fixed messages.
type scriptedSubscriber struct {
	msgs  []transport.Message
	acked []uint64
}

func (s *scriptedSubscriber) Recv(ctx context.Context) (transport.Message, error) {
	if len(s.msgs) == 0 {
		return transport.Message{}, errors.New("no more messages")
	}
	m := s.msgs[0]
	s.msgs = s.msgs[1:]
	return m, nil
}

func (s *scriptedSubscriber) Ack(ctx context.Context, seq uint64) error {
	s.acked = append(s.acked, seq)
	return nil
}

func (s *scriptedSubscriber) Close() error { return nil }

// TestAwaitCommitRejects: a commit for another version, bucket metadata
// where the commit belongs, or a commit where bucket metadata belongs, is
// an error that says what disagrees; nothing wrong is acknowledged.
func TestAwaitCommitRejects(t *testing.T) {
	ctx := context.Background()
	meta, _ := wire.EncodeMeta(&wire.BucketMeta{Seq: 5, Version: 2})
	cases := map[string]struct {
		msg  transport.Message
		want string
	}{
		"other version": {transport.Message{Seq: 5, Data: wire.EncodeCommit(3)}, "root committed version 3, but this rank received version 2"},
		"bucket":        {transport.Message{Seq: 5, Data: meta}, "expected the commit message of version 2"},
		"other seq":     {transport.Message{Seq: 6, Data: wire.EncodeCommit(2)}, "as message 5, got message 6"},
	}
	for name, c := range cases {
		sub := &scriptedSubscriber{msgs: []transport.Message{c.msg}}
		err := AwaitCommit(ctx, sub, 5, 2, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) || len(sub.acked) != 0 {
			t.Errorf("%s: %v (acked %v)", name, err, sub.acked)
		}
	}
	sub := &scriptedSubscriber{msgs: []transport.Message{{Seq: 5, Data: wire.EncodeCommit(2)}}}
	if err := AwaitCommit(ctx, sub, 5, 2, nil); err != nil || len(sub.acked) != 1 || sub.acked[0] != 5 {
		t.Fatalf("a good commit: %v, acked %v", err, sub.acked)
	}

	// A commit message where the metadata of a bucket was expected.
	pool, err := NewPool(mem.Host{}, 2, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	r := NewReceiver(ReceiverConfig{Subscriber: &scriptedSubscriber{msgs: []transport.Message{{Seq: 0, Data: wire.EncodeCommit(1)}}}, Pool: pool, Rank: 1})
	if _, err := r.Sync(ctx, newMemModel()); err == nil || !strings.Contains(err.Error(), "is a commit message") {
		t.Fatalf("a commit message instead of bucket metadata: %v", err)
	}
	if r.State() != StateIntact || r.Committed() != 0 {
		t.Fatalf("state %v, committed %d", r.State(), r.Committed())
	}
}

// watchedBus is a metadata bus end for abortBus: a Watcher that fails
// with reason when the test closes failed, and an Aborter that records
// what it was told.
type watchedBus struct {
	failed  chan struct{}
	reason  error
	aborted error
}

func (b *watchedBus) Failed() <-chan struct{} { return b.failed }

func (b *watchedBus) Err() error {
	select {
	case <-b.failed:
		return b.reason
	default:
		return nil
	}
}

func (b *watchedBus) Abort(err error) { b.aborted = err }

// TestAbortBusWaitsForTheBussWord: a round that failed because a
// neighbour hung up names what the bus says a moment later (the root fell
// silent), and tells the other side that, not the neighbour alone.
func TestAbortBusWaitsForTheBussWord(t *testing.T) {
	lost := fmt.Errorf("tcp broadcast: rank 2 closed the connection: %w", transport.ErrPeerGone)
	t.Run("the bus fails a moment later", func(t *testing.T) {
		b := &watchedBus{failed: make(chan struct{}), reason: errors.New("no message or heartbeat from the root (rank 0) for 3s")}
		time.AfterFunc(50*time.Millisecond, func() { close(b.failed) })
		err := abortBus(b, lost, nil)
		if !errors.Is(err, transport.ErrPeerGone) || !strings.Contains(err.Error(), "rank 2 closed") || !strings.Contains(err.Error(), "(the metadata bus: no message or heartbeat from the root (rank 0)") {
			t.Fatalf("abortBus = %v", err)
		}
		if b.aborted != err {
			t.Fatalf("the bus was told %v, want %v", b.aborted, err)
		}
	})
	t.Run("the bus stays up", func(t *testing.T) {
		b := &watchedBus{failed: make(chan struct{})}
		if err := abortBus(b, lost, nil); err != lost || b.aborted != lost {
			t.Fatalf("abortBus = %v, told %v; want %v unchanged", err, b.aborted, lost)
		}
	})
	t.Run("not a lost peer", func(t *testing.T) {
		b := &watchedBus{failed: make(chan struct{}), reason: errors.New("bus reason")}
		close(b.failed)
		own := errors.New("bucket 3: checksum mismatch")
		if err := abortBus(b, own, nil); err != own || b.aborted != own {
			t.Fatalf("abortBus = %v, told %v; want %v unchanged", err, b.aborted, own)
		}
	})
}

// TestAbortBusHearsWitnesses: the word of a witness other than the bus
// (the rendezvous's verdict on a tampered record) is added the same way,
// under its own name, and a witness that fails with no reason to give
// (its Err is nil) does not end the wait for the bus's.
func TestAbortBusHearsWitnesses(t *testing.T) {
	lost := fmt.Errorf("rank 2 closed the connection: %w", transport.ErrPeerGone)
	bus := &watchedBus{failed: make(chan struct{}), reason: errors.New("the root gave up: bucket 7 is short")}
	mute := &watchedBus{failed: make(chan struct{})} // fails, says nothing
	close(mute.failed)
	rdv := &watchedBus{failed: make(chan struct{}), reason: errors.New(`record "ranks/2" was deleted`)}
	time.AfterFunc(30*time.Millisecond, func() { close(rdv.failed) })
	time.AfterFunc(60*time.Millisecond, func() { close(bus.failed) })
	watch := blame.New(nil, blame.Witness{Name: "a mute witness", Failed: mute.Failed, Err: mute.Err},
		blame.Witness{Name: "the rendezvous", Failed: rdv.Failed, Err: rdv.Err})
	err := abortBus(bus, lost, watch)
	if !strings.Contains(err.Error(), `(the rendezvous: record "ranks/2" was deleted)`) {
		t.Fatalf("abortBus = %v, want the rendezvous's word", err)
	}
	if bus.aborted != err {
		t.Fatalf("the bus was told %v, want %v", bus.aborted, err)
	}
}
