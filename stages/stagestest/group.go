package stagestest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/inproc"
)

var groupID atomic.Int64

// Group is one Sender and its Receivers in the test's process, every rank
// a goroutine over the inproc transport and bus with host buckets: the
// rounds that the tests of sinks and sources run their sinks and sources
// through. Receivers[i] is rank i+1; Pools[r] is rank r's.
type Group struct {
	Sender    *stages.Sender
	Receivers []*stages.Receiver
	Pools     []*stages.Pool
	links     [][]func() error // per rank: its endpoint and its end of the bus
}

// GroupOptions shape a Group.
type GroupOptions struct {
	// World is the number of ranks, the root included (at least 2).
	World int
	// Bucket is the size of each rank's two buckets.
	Bucket int
	// Checksum has the root checksum every bucket.
	Checksum bool
	// Tracer, when set, traces every rank's rounds.
	Tracer *pipeline.Tracer
	// WrapEndpoint, when set, wraps each rank's endpoint (to inject faults).
	WrapEndpoint func(rank int, ep transport.Endpoint) transport.Endpoint
}

// NewGroup opens a Group, closed when tb ends.
func NewGroup(tb testing.TB, o GroupOptions) *Group {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := fmt.Sprintf("%s-%d", tb.Name(), groupID.Add(1))
	cfg := func(rank int) transport.Config {
		return transport.Config{Group: name, Rank: rank, WorldSize: o.World, Device: mem.Host{}, Timeout: 20 * time.Second}
	}
	eps := make([]transport.Endpoint, o.World)
	errs := make([]error, o.World)
	var wg sync.WaitGroup
	for r := range o.World {
		wg.Go(func() { eps[r], errs[r] = transport.Open(ctx, inproc.Name, cfg(r)) })
	}
	wg.Wait()
	g := &Group{links: make([][]func() error, o.World)}
	tb.Cleanup(g.close)
	for r, ep := range eps {
		if ep != nil {
			g.links[r] = append(g.links[r], ep.Close)
		}
	}
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
	for r := range o.World {
		pool, err := stages.NewPool(mem.Host{}, stages.DefaultBuffers, o.Bucket)
		if err != nil {
			tb.Fatal(err)
		}
		g.Pools = append(g.Pools, pool)
		ep := eps[r]
		if o.WrapEndpoint != nil {
			ep = o.WrapEndpoint(r, ep)
		}
		if r == 0 {
			pub, err := inproc.OpenPublisher(ctx, cfg(r))
			if err != nil {
				tb.Fatal(err)
			}
			g.links[r] = append(g.links[r], pub.Close)
			g.Sender = stages.NewSender(stages.SenderConfig{Endpoint: ep, Publisher: pub, Pool: pool, Checksum: o.Checksum, Tracer: o.Tracer})
			continue
		}
		sub, err := inproc.OpenSubscriber(ctx, cfg(r))
		if err != nil {
			tb.Fatal(err)
		}
		g.links[r] = append(g.links[r], sub.Close)
		g.Receivers = append(g.Receivers, stages.NewReceiver(stages.ReceiverConfig{Endpoint: ep, Subscriber: sub, Pool: pool, Tracer: o.Tracer, Rank: r}))
	}
	return g
}

func (g *Group) close() {
	if g.Sender != nil {
		g.Sender.Close()
	}
	for _, r := range g.Receivers {
		r.Close()
	}
	for r := range g.links {
		g.CloseLinks(r)
	}
	for _, p := range g.Pools {
		p.Close()
	}
}

// CloseLinks closes rank's endpoint and its end of the bus, as the
// process of a failed rank closes them on exit, so that the other ranks
// notice at once. Closing them again does nothing.
func (g *Group) CloseLinks(rank int) {
	for _, c := range g.links[rank] {
		c()
	}
}

// Round runs round version of src on every rank, receiver i+1 loading into
// sinks[i], and returns every rank's error joined; it also fails when a
// receiver commits another version.
func (g *Group) Round(ctx context.Context, src stages.Source, version uint64, sinks []stages.Sink) error {
	errs := g.run(ctx, src, version, sinks, false)
	for i, r := range g.Receivers {
		if errs[i+1] == nil && r.Committed() != version {
			errs[i+1] = fmt.Errorf("receiver %d committed version %d, want %d", i+1, r.Committed(), version)
		}
	}
	return errors.Join(errs...)
}

// RoundClosingOnError runs round version as Round does, except that a
// rank whose Sync fails closes its links at once (CloseLinks), and returns
// each rank's error, the root's first.
func (g *Group) RoundClosingOnError(ctx context.Context, src stages.Source, version uint64, sinks []stages.Sink) []error {
	return g.run(ctx, src, version, sinks, true)
}

func (g *Group) run(ctx context.Context, src stages.Source, version uint64, sinks []stages.Sink, closeOnError bool) []error {
	errs := make([]error, len(g.Receivers)+1)
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, errs[0] = g.Sender.Sync(ctx, src, version); errs[0] != nil && closeOnError {
			g.CloseLinks(0)
		}
	})
	for i, r := range g.Receivers {
		wg.Go(func() {
			if _, errs[i+1] = r.Sync(ctx, sinks[i]); errs[i+1] != nil && closeOnError {
				g.CloseLinks(i + 1)
			}
		})
	}
	wg.Wait()
	return errs
}

// WriteRounds runs rounds 1 to rounds of src through a new Group of
// 1+len(outs) ranks with buckets of bucket bytes and checksums, whose
// receivers write each round with sink.WriteSafetensors (without fsync)
// into outs, and returns their sinks.
func WriteRounds(tb testing.TB, src stages.Source, bucket int, outs []string, rounds int) []*sink.Safetensors {
	tb.Helper()
	g := NewGroup(tb, GroupOptions{World: len(outs) + 1, Bucket: bucket, Checksum: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sinks []stages.Sink
	var sts []*sink.Safetensors
	for _, o := range outs {
		s := sink.WriteSafetensors(o, sink.SafetensorsWithoutSync())
		sinks, sts = append(sinks, s), append(sts, s)
	}
	for round := 1; round <= rounds; round++ {
		if err := g.Round(ctx, src, uint64(round), sinks); err != nil {
			tb.Fatal(err)
		}
	}
	return sts
}
