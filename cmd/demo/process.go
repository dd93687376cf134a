package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/rendezvous"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
	"github.com/weightcast/weightcast/transport"
	_ "github.com/weightcast/weightcast/transport/tcp" // registers "tcp"
	"github.com/weightcast/weightcast/transport/zmqbus"
)

// peerGoneGrace is how long a rank lets its transports report a failure
// before it acts on the rendezvous saying a peer is gone.
const peerGoneGrace = 2 * time.Second

// runProcessRank runs one rank in this process: it meets the others through
// etcd, opens its transport and metadata bus, and runs every round. A lost
// peer (its rendezvous lease expired) cancels the run with that cause.
func runProcessRank(ctx context.Context, c *config, transportName string, tracer *pipeline.Tracer, report func(event)) (*rankResult, error) {
	endpoint, err := etcdEndpoint(c.rendezvous)
	if err != nil {
		return nil, err
	}
	if c.hostEtcd != "" {
		emb, err := embedetcd.Start(ctx, embedetcd.Options{Addr: c.hostEtcd, TLS: c.tlsFiles})
		if err != nil {
			return nil, fmt.Errorf("serving the rendezvous on %s: %w", c.hostEtcd, err)
		}
		defer emb.Close()
	}
	var keys *auth.Keys // the run's keys from the group secret; nil without one
	if c.secret != nil {
		if keys, err = c.secret.RunKeys(c.group, c.runID); err != nil {
			return nil, err
		}
	}
	store, err := rendezvous.DialEtcd(ctx, []string{endpoint}, c.timeout, rendezvous.WithTLS(c.tls))
	if err != nil {
		return nil, err
	}
	group, err := rendezvous.Join(ctx, store, rendezvous.JoinOptions{
		Group: c.group, RunID: c.runID, Rank: c.rank, WorldSize: c.worldSize, Timeout: c.timeout, Auth: keys,
	})
	if err != nil {
		return nil, err // Join closed the store
	}
	defer group.Close()

	var watch sync.WaitGroup
	defer watch.Wait()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil) // runs before watch.Wait: ends the watcher below
	watch.Go(func() {
		select {
		case <-group.PeerGone():
		case <-ctx.Done():
			return
		}
		// A lost peer ends the run, but not at once: when a rank fails,
		// its neighbours usually fail and leave within milliseconds too,
		// and the transports' own errors name the rank that really went
		// first. The rendezvous is the backstop for what they cannot see
		// (a dead NCCL peer, a stopped process).
		select {
		case <-time.After(peerGoneGrace):
			cancel(group.Err())
		case <-ctx.Done():
		}
	})

	dev, err := rankDevice(c, transportName, c.rank)
	if err != nil {
		return nil, err
	}
	if cl, ok := dev.(interface{ Close() error }); ok {
		defer cl.Close() // after the transport and the buffers, deferred below
	}
	cfg := transport.Config{Group: c.group, Rank: c.rank, WorldSize: c.worldSize, Device: dev, Exchange: group, Timeout: c.timeout,
		Auth: keys, TLS: c.tls}
	// Sockets other hosts connect to (the metadata bus, the tcp chain)
	// listen on every interface and publish --advertise. ipc and nccl
	// find their peers themselves.
	netCfg := cfg
	if c.advertise != "" {
		netCfg.Options = map[string]string{"bind": "0.0.0.0", "advertise": c.advertise}
	}
	l := &links{}
	defer l.close()
	if c.rank == 0 {
		l.publisher, err = zmqbus.OpenPublisher(ctx, netCfg)
	} else {
		l.sub, err = zmqbus.OpenSubscriber(ctx, netCfg)
	}
	if err != nil {
		return nil, err
	}
	tcfg := cfg
	if transportName == "tcp" {
		tcfg = netCfg
	}
	if l.endpoint, err = transport.Open(ctx, transportName, tcfg); err != nil {
		return nil, err
	}
	// The run ends as docs/protocol.md says: once every receiver has
	// acknowledged the last commit, rank 0 closes its metadata bus (BYE,
	// when l.close runs below) and its Group waits for the others to
	// leave; each receiver leaves when it hears that BYE (runRank).
	res, err := runRank(ctx, c, c.rank, l, dev, tracer, report)
	if cause := context.Cause(ctx); err != nil && cause != nil && cause != context.Canceled && !strings.Contains(err.Error(), cause.Error()) {
		err = fmt.Errorf("%w (cause: %v)", err, cause)
	}
	if err != nil && errors.Is(err, transport.ErrPeerGone) {
		err = tamperedCause(err, group)
	}
	return res, err
}

// tamperedCause adds to err, a transport's lost peer, what the rendezvous
// saw meanwhile if that was tampering: a peer that stopped because its
// etcd record was deleted or rewritten closes its connections before its
// neighbours' rendezvous watches report it, so they wait for that briefly.
func tamperedCause(err error, group *rendezvous.Group) error {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-group.PeerGone():
	case <-t.C:
	}
	if gerr := group.Err(); errors.Is(gerr, rendezvous.ErrTampered) && !strings.Contains(err.Error(), gerr.Error()) {
		return fmt.Errorf("%w (the rendezvous: %v)", err, gerr)
	}
	return err
}

// How long a rank process that was asked to stop takes at most to end its
// round: then it exits at once. A live launcher kills it sooner
// (stopGrace); these bound an orphan. Without its launcher a rank has no
// one to report to and no etcd (the launcher serves it), so it only gives
// its round's abort a moment to reach its peers.
const (
	childStopLimit = 8 * time.Second
	orphanLimit    = 2 * time.Second
)

// errLauncherGone is the cause of a rank process's context when its
// standard input, which the launcher holds open, reaches its end.
var errLauncherGone = errors.New("the launcher is gone")

// childMain is a rank process started by the launcher: it reports progress
// and its result as JSON lines on stdout and writes its trace events. It
// stops on SIGTERM, and when its launcher is gone (its standard input
// ends: the second line of defence after the kernel's Pdeathsig).
func childMain(ctx context.Context, c *config, transportName string) int {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		cancel(errLauncherGone)
		time.Sleep(orphanLimit)
		os.Exit(exitFailed)
	}()
	go func() {
		<-ctx.Done()
		if _, stopped := stoppedBy(ctx); stopped {
			time.Sleep(childStopLimit)
			os.Exit(exitFailed)
		}
	}()
	enc := json.NewEncoder(os.Stdout)
	var tracer *pipeline.Tracer
	if c.traceOut != "" {
		tracer = pipeline.NewTracer(time.Unix(0, c.traceEpoch))
	}
	res, err := runProcessRank(ctx, c, transportName, tracer, func(ev event) { enc.Encode(ev) })
	if res == nil {
		res = &rankResult{Rank: c.rank}
	}
	res.PeakRSS = peakRSS()
	if err != nil {
		res.Error = err.Error()
		if sig, ok := stoppedBy(ctx); ok {
			res.Stopped = signalName(sig.sig)
		} else if errors.Is(context.Cause(ctx), errLauncherGone) {
			res.Stopped = "launcher gone"
		}
	}
	if tracer != nil {
		if f, ferr := os.Create(c.traceOut); ferr == nil {
			tracer.WriteChrome(f, nil)
			f.Close()
		}
	}
	enc.Encode(event{Type: "result", Rank: c.rank, Result: res})
	switch {
	case err == nil:
		return exitOK
	case res.Stopped != "":
		return exitFailed // the launcher's summary says what stopped it
	}
	fmt.Fprintf(os.Stderr, "rank %d: %v\n", c.rank, err)
	return exitFailed
}
