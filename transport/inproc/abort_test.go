package inproc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
)

// TestAbort: a receiver that gives up its round says why, and the root
// and the other receivers fail with that reason at once instead of
// waiting out their timeouts; the same when the root gives up.
func TestAbort(t *testing.T) {
	for _, by := range []int{0, 2} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cfg := func(r int) transport.Config {
			return transport.Config{Group: t.Name() + string(rune('a'+by)), Rank: r, WorldSize: 3, Device: mem.Host{}, Timeout: 20 * time.Second}
		}
		pub, err := OpenPublisher(ctx, cfg(0))
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		subs := make([]transport.Subscriber, 3)
		for r := 1; r < 3; r++ {
			if subs[r], err = OpenSubscriber(ctx, cfg(r)); err != nil {
				t.Fatal(err)
			}
			defer subs[r].Close()
		}
		if err := pub.Publish(ctx, 0, []byte("m0")); err != nil {
			t.Fatal(err)
		}
		reason := errors.New("disk full on rank 2's output")
		if by == 0 {
			pub.(transport.Aborter).Abort(reason)
		} else {
			subs[by].(transport.Aborter).Abort(reason)
		}
		start := time.Now()
		var errs []error
		if by != 0 {
			errs = append(errs, pub.Sync(ctx))
		}
		for r := 1; r < 3; r++ {
			if r == by {
				continue
			}
			if _, err := subs[r].Recv(ctx); err != nil { // message 0 is delivered
				t.Fatal(err)
			}
			_, err := subs[r].Recv(ctx)
			errs = append(errs, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("the abort took %v to reach the others", d)
		}
		for _, err := range errs {
			var te *transport.Error
			if !errors.As(err, &te) || te.Peer != by || !strings.Contains(err.Error(), reason.Error()) {
				t.Errorf("abort by rank %d: want an error naming it and its reason, got %v", by, err)
			}
		}
	}
}
