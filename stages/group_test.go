package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/inproc"
)

var groupID atomic.Int64

// group is one sender and n receivers in this process over the inproc
// transport and bus, as the tests use it.
type group struct {
	sender    *Sender
	receivers []*Receiver
	pools     []*Pool
	closers   []func() error
}

type groupOpts struct {
	world    int
	bucket   int
	checksum bool
	tracer   *pipeline.Tracer
	wrapEP   func(rank int, ep transport.Endpoint) transport.Endpoint
	auth     *auth.Keys // the run's keys: buckets carry MACs, messages are signed
	mac      mac.Kind   // the buckets' MAC
}

func newGroup(t testing.TB, o groupOpts) *group {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := fmt.Sprintf("%s-%d", t.Name(), groupID.Add(1))
	g := &group{}
	eps := make([]transport.Endpoint, o.world)
	errs := make([]error, o.world)
	var wg sync.WaitGroup
	for r := range o.world {
		wg.Go(func() {
			eps[r], errs[r] = transport.Open(ctx, inproc.Name, transport.Config{Group: name, Rank: r, WorldSize: o.world, Device: mem.Host{}, Timeout: 20 * time.Second})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range o.world {
		cfg := transport.Config{Group: name, Rank: r, WorldSize: o.world, Device: mem.Host{}, Timeout: 20 * time.Second}
		pool, err := NewPool(mem.Host{}, DefaultBuffers, o.bucket)
		if err != nil {
			t.Fatal(err)
		}
		g.pools = append(g.pools, pool)
		ep := eps[r]
		if o.wrapEP != nil {
			ep = o.wrapEP(r, ep)
		}
		g.closers = append(g.closers, eps[r].Close)
		if r == 0 {
			pub, err := inproc.OpenPublisher(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			g.closers = append(g.closers, pub.Close)
			g.sender = NewSender(SenderConfig{Endpoint: ep, Publisher: pub, Pool: pool, Checksum: o.checksum, Tracer: o.tracer, Auth: o.auth, BucketMAC: o.mac})
		} else {
			sub, err := inproc.OpenSubscriber(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			g.closers = append(g.closers, sub.Close)
			g.receivers = append(g.receivers, NewReceiver(ReceiverConfig{Endpoint: ep, Subscriber: sub, Pool: pool, Tracer: o.tracer, Rank: r, Auth: o.auth}))
		}
	}
	t.Cleanup(g.close)
	return g
}

func (g *group) close() {
	if g.sender != nil {
		g.sender.Close()
	}
	for _, r := range g.receivers {
		r.Close()
	}
	for _, c := range g.closers {
		c()
	}
	for _, p := range g.pools {
		p.Close()
	}
}

// round runs one sync round on every rank and returns the first error.
func (g *group) round(ctx context.Context, src Source, version uint64, sinks []Sink) error {
	var wg sync.WaitGroup
	errs := make([]error, len(g.receivers)+1)
	wg.Go(func() {
		_, errs[0] = g.sender.Sync(ctx, src, version)
	})
	for i, r := range g.receivers {
		wg.Go(func() {
			st, err := r.Sync(ctx, sinks[i])
			if err == nil && st.Version != version {
				err = fmt.Errorf("receiver %d committed version %d, want %d", i+1, st.Version, version)
			}
			errs[i+1] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
