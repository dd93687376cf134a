package zmqbus

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/transport"
)

// TestAbortCarriesTheReason: when the root's round fails, every receiver
// fails with the root's reason (ABORTED), not with a bare "root left".
func TestAbortCarriesTheReason(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	pub, subs := openAll(t, ctx, configs(t, 3, 10*time.Second, nil))
	if err := pub.Publish(ctx, 0, []byte("bucket 0")); err != nil {
		t.Fatal(err)
	}
	pub.(transport.Aborter).Abort(errors.New("tcp broadcast: rank 2 is gone"))
	for i, s := range subs {
		m, err := s.Recv(ctx)
		if err == nil && m.Seq == 0 {
			_, err = s.Recv(ctx)
		}
		if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 2 is gone") {
			t.Errorf("subscriber %d: %v; want ErrAborted with the root's reason", i, err)
		}
	}
	if err := pub.Publish(ctx, 1, []byte("x")); err == nil {
		t.Error("Publish after Abort succeeded")
	}
}

// TestSubscriberAbortReachesTheRoot: a receiver whose round failed tells the
// root why, and the root fails naming that reason.
func TestSubscriberAbortReachesTheRoot(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	pub, subs := openAll(t, ctx, configs(t, 2, 10*time.Second, nil))
	if err := pub.Publish(ctx, 0, []byte("bucket 0")); err != nil {
		t.Fatal(err)
	}
	sub := subs[0]
	if _, err := sub.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	sub.(transport.Aborter).Abort(errors.New("tcp broadcast: rank 2 is gone"))
	err := pub.Sync(ctx)
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "rank 2 is gone") || !strings.Contains(err.Error(), "rank 1") {
		t.Fatalf("root's Sync after a receiver aborted: %v; want ErrAborted naming rank 1 and its reason", err)
	}
}

// TestAbortReachesLateReceivers: a receiver that says HELLO after the root
// aborted (the root gave up before its first message) fails with the
// root's reason at once, instead of waiting for a bus that is over.
func TestAbortReachesLateReceivers(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	cfgs := configs(t, 2, 10*time.Second, nil)
	pub := openPublisher(t, ctx, cfgs[0])
	pub.(transport.Aborter).Abort(errors.New("the trainer's generator raised"))
	start := time.Now()
	sub, err := OpenSubscriber(ctx, cfgs[1])
	if err == nil {
		defer sub.Close()
		_, err = sub.Recv(ctx)
	}
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "generator raised") {
		t.Fatalf("late receiver: %v; want ErrAborted with the root's reason", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("late receiver took %v to fail", d)
	}
}

// TestWatcherTellsTheOtherSide: an Abort closes Failed on the other side,
// with the reason in Err, and never on the side that aborted (its own
// round already knows why it failed).
func TestWatcherTellsTheOtherSide(t *testing.T) {
	failed := func(w transport.Watcher) bool {
		select {
		case <-w.Failed():
			return true
		default:
			return false
		}
	}
	wait := func(t *testing.T, w transport.Watcher, want string) {
		t.Helper()
		select {
		case <-w.Failed():
		case <-time.After(10 * time.Second):
			t.Fatalf("Failed not closed 10s after the other side aborted")
		}
		if err := w.Err(); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Err: %v; want the other side's reason %q", err, want)
		}
	}
	t.Run("receiver aborts", func(t *testing.T) {
		ctx := testContext(t, 30*time.Second)
		pub, subs := openAll(t, ctx, configs(t, 3, 10*time.Second, nil))
		subs[1].(transport.Aborter).Abort(errors.New("load_into: no tensor p0"))
		wait(t, pub.(transport.Watcher), "no tensor p0")
		if failed(subs[1].(transport.Watcher)) {
			t.Error("the receiver that aborted sees its own bus as failed by the other side")
		}
		wait(t, subs[0].(transport.Watcher), "no tensor p0") // the root's abort passes it on
	})
	t.Run("root aborts", func(t *testing.T) {
		ctx := testContext(t, 30*time.Second)
		pub, subs := openAll(t, ctx, configs(t, 2, 10*time.Second, nil))
		pub.(transport.Aborter).Abort(errors.New("the trainer's generator failed"))
		wait(t, subs[0].(transport.Watcher), "the trainer's generator failed")
		if failed(pub.(transport.Watcher)) {
			t.Error("the root that aborted sees its own bus as failed by the other side")
		}
	})
}
