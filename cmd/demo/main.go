package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/nccl"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/timeline"
	"github.com/weightcast/weightcast/transport"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 2
	}
	name, reason, err := chooseTransport(c)
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return 2
	}
	if c.child {
		return childMain(ctx, c, name)
	}

	u := &ui{w: stderr, tty: isTerminal(os.Stderr), rounds: c.rounds}
	var tracer *pipeline.Tracer
	if c.trace != "" || c.timeline != "" {
		tracer = pipeline.NewTracer(time.Now())
	}
	var results []*rankResult
	mode := ""
	switch {
	case c.rank >= 0:
		mode = fmt.Sprintf("rank %d of a group of %d", c.rank, c.worldSize)
		u.say("weightcast demo: rank %d of %d, transport %s (%s), rendezvous %s", c.rank, c.worldSize, name, reason, c.rendezvous)
		res, err := runProcessRank(ctx, c, name, tracer, u.event)
		if res == nil {
			res = &rankResult{Rank: c.rank}
		}
		res.PeakRSS = peakRSS()
		res.Error = errString(err)
		results = []*rankResult{res}
	case name == "inproc":
		mode = "goroutines of one process"
		u.say("weightcast demo: %d ranks in one process, transport inproc, %s, %s buckets, %d rounds",
			c.ranks, c.modelText(), sizeText(c.bucket), c.rounds)
		results = runInProcess(ctx, c, tracer, u.event)
		if len(results) > 0 {
			for _, r := range results {
				r.PeakRSS = peakRSS() // one process: the same figure for all
			}
		}
	default:
		mode = "local processes"
		u.say("weightcast demo: starting %d rank processes, transport %s (%s), %s, %s buckets, %d rounds",
			c.ranks, name, reason, c.modelText(), sizeText(c.bucket), c.rounds)
		results, err = launchLocal(ctx, c, name, tracer, u)
		if err != nil {
			fmt.Fprintf(stderr, "demo: %v\n", err)
			return 1
		}
	}

	s := summarize(c, name, reason, mode, results)
	if tracer != nil {
		if err := writeTrace(c, tracer, args, name); err != nil {
			fmt.Fprintf(stderr, "demo: %v\n", err)
			s.Error = strings.TrimPrefix(s.Error+"; "+err.Error(), "; ")
		}
	}
	if c.json {
		s.writeJSON(stdout)
	} else {
		s.writeTable(stdout)
	}
	if s.Error != "" {
		return 1
	}
	return 0
}

// chooseTransport resolves --transport auto and says why.
func chooseTransport(c *config) (name, reason string, err error) {
	registered := transport.Names()
	if c.transport != "auto" {
		if c.transport != "inproc" && !slices.Contains(registered, c.transport) {
			return "", "", fmt.Errorf("--transport %s is not available in this build (available: inproc, %s)", c.transport, strings.Join(registered, ", "))
		}
		if c.transport == "ipc" || c.transport == "nccl" {
			if _, err := c.gpuList(); err != nil {
				return "", "", fmt.Errorf("--transport %s needs a GPU: %v; use --transport tcp on machines without one", c.transport, err)
			}
		}
		return c.transport, "chosen with --transport", nil
	}
	n, err := gpu.DeviceCount()
	switch {
	case errors.Is(err, gpu.ErrNoCgo):
		return "tcp", "this binary was built without cgo, so it cannot use GPUs", nil
	case errors.Is(err, gpu.ErrNoDriver):
		return "tcp", "no NVIDIA driver on this machine", nil
	case err != nil:
		return "tcp", fmt.Sprintf("no usable GPU: %v", err), nil
	case n == 0:
		return "tcp", "no GPU visible", nil
	}
	if len(c.devices) > 0 {
		n = len(c.devices)
	}
	if n >= 2 && n >= c.ranks && slices.Contains(registered, "nccl") {
		if err := nccl.Load(nccl.Options{}); err != nil {
			return "ipc", fmt.Sprintf("%d GPUs, but NCCL is not usable (%v)", n, err), nil
		}
		return "nccl", fmt.Sprintf("%d GPUs, one per rank", n), nil
	}
	if slices.Contains(registered, "ipc") {
		return "ipc", fmt.Sprintf("%d ranks share %d GPU(s) of this host", c.ranks, n), nil
	}
	return "tcp", fmt.Sprintf("%d GPUs visible, but this build has no GPU transport", n), nil
}

// writeTrace writes the merged trace and, when asked, its timeline.
func writeTrace(c *config, tracer *pipeline.Tracer, args []string, transportName string) error {
	path := c.trace
	if path == "" {
		f, err := os.CreateTemp("", "weightcast-trace-*.json")
		if err != nil {
			return err
		}
		path = f.Name()
		f.Close()
		defer os.Remove(path)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing the trace: %w", err)
	}
	other := map[string]any{"command": "demo " + strings.Join(args, " "), "transport": transportName}
	if err := tracer.WriteChrome(f, other); err != nil {
		f.Close()
		return fmt.Errorf("writing the trace %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing the trace %s: %w", path, err)
	}
	if c.timeline != "" {
		title := fmt.Sprintf("weightcast: %d ranks, %s, %s, %s buckets", c.ranks, transportName, c.modelText(), sizeText(c.bucket))
		if err := timeline.RenderFile(path, c.timeline, timeline.Options{Title: title}); err != nil {
			return fmt.Errorf("drawing the timeline: %w", err)
		}
	}
	return nil
}
