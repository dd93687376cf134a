package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/stages"
	_ "github.com/weightcast/weightcast/transport/tcp" // registers "tcp"
)

// runProcessRank runs one rank in this process: the front door
// (weightcast.OpenSender, OpenReceiver) meets the others through etcd —
// served here by a torchrun-style rank 0 — opens the rank's device,
// transport and metadata bus, and watches for lost peers; a lost peer (its
// rendezvous lease expired) cancels the round with that cause.
func runProcessRank(ctx context.Context, c *config, transportName string, tracer *pipeline.Tracer, report func(event)) (*rankResult, error) {
	device, err := rankDevice(c, transportName, c.rank)
	if err != nil {
		return nil, err
	}
	o := c.opts // the run's settings, checked when the flags were read
	o.Group, o.RunID, o.Rank, o.WorldSize, o.Rendezvous, o.ServeRendezvous = c.group, c.runID, c.rank, c.worldSize, c.rendezvous, c.served
	o.Transport, o.Device, o.Quantize = transportName, device, stages.QuantizeConfig{} // runRank sets rank 0's
	return runRank(ctx, c, o, tracer, report)
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
