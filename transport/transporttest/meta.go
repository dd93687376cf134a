package transporttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/transport"
)

// MetaOpeners opens the two sides of a metadata bus.
type MetaOpeners struct {
	Publisher  func(ctx context.Context, cfg transport.Config) (transport.Publisher, error)
	Subscriber func(ctx context.Context, cfg transport.Config) (transport.Subscriber, error)
}

// OpenBus opens the publisher (cfgs[0]) and every subscriber (cfgs[1:])
// concurrently, since one side's Open may wait for the other, and
// closes them when the test or benchmark ends. It returns the publisher and
// the subscribers of ranks 1, 2, ... in that order.
func OpenBus(t testing.TB, ctx context.Context, o MetaOpeners, cfgs []transport.Config) (transport.Publisher, []transport.Subscriber) {
	t.Helper()
	var (
		pub  transport.Publisher
		subs = make([]transport.Subscriber, len(cfgs))
		errs = make([]error, len(cfgs))
		wg   sync.WaitGroup
	)
	for r := range cfgs {
		wg.Go(func() {
			if r == 0 {
				pub, errs[0] = o.Publisher(ctx, cfgs[0])
			} else {
				subs[r], errs[r] = o.Subscriber(ctx, cfgs[r])
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		if pub != nil {
			pub.Close()
		}
		for _, s := range subs {
			if s != nil {
				s.Close()
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("open bus: %v", err)
	}
	return pub, subs[1:]
}

// TestMetaBus runs the metadata-bus conformance suite.
func TestMetaBus(t *testing.T, prefix string, o MetaOpeners) {
	t.Run("InOrderLossless", func(t *testing.T) { testInOrder(t, prefix+"-order", o) })
	t.Run("Window", func(t *testing.T) { testWindow(t, prefix+"-window", o) })
	t.Run("SubscriberGone", func(t *testing.T) { testSubscriberGone(t, prefix+"-gone", o) })
}

// testInOrder publishes 200 messages to 3 subscribers that ack as they go;
// every subscriber sees every message once, in order, intact.
func testInOrder(t *testing.T, group string, o MetaOpeners) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, subs := OpenBus(t, ctx, o, Configs(group, 4, 20*time.Second))
	const n = 200
	msg := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("m%03d|", i)), 1+i%50) }
	var wg sync.WaitGroup
	errs := make([]error, len(subs)+1)
	for i, s := range subs {
		wg.Go(func() {
			for k := range n {
				m, err := s.Recv(ctx)
				if err != nil {
					errs[i] = err
					return
				}
				if m.Seq != uint64(k) || !bytes.Equal(m.Data, msg(k)) {
					errs[i] = fmt.Errorf("subscriber %d: message %d came as seq %d with %d bytes", i+1, k, m.Seq, len(m.Data))
					return
				}
				if err := s.Ack(ctx, m.Seq); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Go(func() {
		for k := range n {
			if err := pub.Publish(ctx, uint64(k), msg(k)); err != nil {
				errs[len(subs)] = err
				return
			}
		}
		errs[len(subs)] = pub.Sync(ctx)
	})
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// testWindow checks that the publisher stops after DefaultWindow
// unacknowledged messages and resumes on an ack.
func testWindow(t *testing.T, group string, o MetaOpeners) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, subs := OpenBus(t, ctx, o, Configs(group, 2, 20*time.Second))
	for k := range transport.DefaultWindow {
		if err := pub.Publish(ctx, uint64(k), []byte{byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	blocked := make(chan error, 1)
	go func() { blocked <- pub.Publish(ctx, transport.DefaultWindow, []byte{9}) }()
	select {
	case err := <-blocked:
		t.Fatalf("publish past the window returned early: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	m, err := subs[0].Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := subs[0].Ack(ctx, m.Seq); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-blocked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("publish did not resume after an ack")
	}
	if err := subs[0].Ack(ctx, 5); err == nil {
		t.Fatal("ack of a message not yet received succeeded")
	}
}

// testSubscriberGone: a subscriber that closes without acking makes the
// publisher fail (peer gone or timeout), never hang.
func testSubscriberGone(t *testing.T, group string, o MetaOpeners) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pub, subs := OpenBus(t, ctx, o, Configs(group, 3, 2*time.Second))
	subs[1].Close()
	var err error
	for k := range transport.DefaultWindow + 1 {
		if err = pub.Publish(ctx, uint64(k), []byte("x")); err != nil {
			break
		}
	}
	if err == nil {
		err = pub.Sync(ctx)
	}
	if err == nil {
		t.Fatal("publishing to a departed subscriber succeeded")
	}
	var te *transport.Error
	if !errors.As(err, &te) {
		t.Fatalf("error is not a *transport.Error: %v", err)
	}
}
