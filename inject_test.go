package weightcast

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/inproc"
)

// counted counts the Close calls of what it wraps.
type counted[T interface{ Close() error }] struct {
	inner  T
	closes *atomic.Int32
}

type countedEndpoint struct{ counted[transport.Endpoint] }

func (e countedEndpoint) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	return e.inner.Broadcast(ctx, seq, buf, n)
}
func (e countedEndpoint) Close() error { e.closes.Add(1); return e.inner.Close() }

type countedPublisher struct{ counted[transport.Publisher] }

func (p countedPublisher) Publish(ctx context.Context, seq uint64, msg []byte) error {
	return p.inner.Publish(ctx, seq, msg)
}
func (p countedPublisher) Sync(ctx context.Context) error { return p.inner.Sync(ctx) }
func (p countedPublisher) Close() error                   { p.closes.Add(1); return p.inner.Close() }

type countedSubscriber struct{ counted[transport.Subscriber] }

func (s countedSubscriber) Recv(ctx context.Context) (transport.Message, error) {
	return s.inner.Recv(ctx)
}
func (s countedSubscriber) Ack(ctx context.Context, seq uint64) error { return s.inner.Ack(ctx, seq) }
func (s countedSubscriber) Close() error                              { s.closes.Add(1); return s.inner.Close() }

// TestInjectedLinks gives every rank its byte transport and metadata bus
// in Options, as a test or a custom pipeline would: the ranks use them,
// say so, and leave closing them to the caller.
func TestInjectedLinks(t *testing.T) {
	const world = 3
	group := fmt.Sprintf("inject-%d", groupID.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var closes atomic.Int32
	eps := make([]transport.Endpoint, world)
	buses := make([]interface{ Close() error }, world)
	s, rs := (*Sender)(nil), make([]*Receiver, world-1)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			cfg := transport.Config{Group: group, Rank: r, WorldSize: world, Device: mem.Host{}, Timeout: 30 * time.Second}
			ep, err := inproc.Open(ctx, cfg)
			if err != nil {
				errs[r] = err
				return
			}
			eps[r] = countedEndpoint{counted[transport.Endpoint]{ep, &closes}}
			o := Options{Group: group, Rank: r, WorldSize: world, Transport: inproc.Name, BucketSize: 4 << 10, Endpoint: eps[r]}
			if r == 0 {
				pub, err := inproc.OpenPublisher(ctx, cfg)
				if err != nil {
					errs[r] = err
					return
				}
				o.Publisher = countedPublisher{counted[transport.Publisher]{pub, &closes}}
				buses[r] = o.Publisher
				s, errs[r] = OpenSender(ctx, o)
				return
			}
			sub, err := inproc.OpenSubscriber(ctx, cfg)
			if err != nil {
				errs[r] = err
				return
			}
			o.Subscriber = countedSubscriber{counted[transport.Subscriber]{sub, &closes}}
			buses[r] = o.Subscriber
			rs[r-1], errs[r] = OpenReceiver(ctx, o)
		})
	}
	wg.Wait()
	closeAll := func() {
		for r := range world {
			for _, c := range []interface{ Close() error }{buses[r], eps[r]} {
				if c != nil {
					c.Close()
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		closeAll()
		t.Fatal(err)
	}
	if name, why := s.Transport(); name != inproc.Name || why != "given in Options.Endpoint" {
		t.Errorf("Transport() = %q, %q; want inproc, given in Options.Endpoint", name, why)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	src := randomTensors(rng, 20, 8<<10)
	models := []*sink.HostModel{sink.NewHostModel(), sink.NewHostModel()}
	send := func(ctx context.Context) error { _, err := s.Send(ctx, src, 1); return err }
	if err := syncRound(ctx, s, rs, send, []stages.Sink{models[0], models[1]}); err != nil {
		t.Fatal(err)
	}
	checkModels(t, src, models)
	wg.Go(func() { s.Close() })
	for _, r := range rs {
		wg.Go(func() { r.Close() })
	}
	wg.Wait()
	if n := closes.Load(); n != 0 {
		t.Errorf("Close of the ranks closed %d of the links they were given; want none", n)
	}
	closeAll()
	if n := closes.Load(); n != 2*world {
		t.Errorf("%d closes, want %d", n, 2*world)
	}
}

// TestInjectedBusSide: a receiver given a Publisher, or a sender a
// Subscriber, is a configuration error.
func TestInjectedBusSide(t *testing.T) {
	var sub transport.Subscriber = countedSubscriber{}
	_, err := OpenSender(context.Background(), Options{Transport: inproc.Name, WorldSize: 2, Subscriber: sub})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("a sender given a Subscriber: %v; want ErrConfig", err)
	}
	var pub transport.Publisher = countedPublisher{}
	_, err = OpenReceiver(context.Background(), Options{Transport: inproc.Name, Rank: 1, WorldSize: 2, Publisher: pub})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("a receiver given a Publisher: %v; want ErrConfig", err)
	}
}
