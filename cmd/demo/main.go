package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/timeline"
	"github.com/weightcast/weightcast/transport"
)

func main() {
	ctx, stop := stopOnSignal(context.Background())
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}

// Exit statuses (docs/operations.md lists them).
const (
	exitOK     = 0
	exitFailed = 1 // the run failed; the summary says which rank and why
	exitUsage  = 2 // a flag or an input the demo cannot use, found before any rank started
)

// stopSignal is the cause of a run's context when SIGINT or SIGTERM stopped
// it.
type stopSignal struct{ sig syscall.Signal }

func (s stopSignal) Error() string { return "stopped by " + signalName(s.sig) }

// exitStatus is the shell's status for a process ended by the signal:
// 130 for SIGINT, 143 for SIGTERM.
func (s stopSignal) exitStatus() int { return 128 + int(s.sig) }

// stoppedBy returns the signal that stopped ctx, if one did.
func stoppedBy(ctx context.Context) (stopSignal, bool) {
	var s stopSignal
	ok := errors.As(context.Cause(ctx), &s)
	return s, ok
}

// stopOnSignal returns a context that the first SIGINT or SIGTERM cancels
// with a stopSignal cause. That signal also restores the default action,
// so a second Ctrl-C ends the process at once. stop releases the handler.
func stopOnSignal(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			signal.Reset(syscall.SIGINT, syscall.SIGTERM)
			cancel(stopSignal{sig.(syscall.Signal)})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}

// signalName is a signal's usual name ("SIGKILL"), where Go's String says
// "killed".
func signalName(sig syscall.Signal) string {
	names := map[syscall.Signal]string{
		syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL",
		syscall.SIGSEGV: "SIGSEGV", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS",
		syscall.SIGHUP: "SIGHUP", syscall.SIGQUIT: "SIGQUIT", syscall.SIGPIPE: "SIGPIPE",
	}
	if n, ok := names[sig]; ok {
		return n
	}
	return fmt.Sprintf("signal %d (%v)", int(sig), sig)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	if len(args) > 0 && args[0] == "plan" {
		return runPlan(args[1:], stdout, stderr) // plan.go
	}
	c, err := parseConfig(args, getenv)
	if errors.Is(err, pflag.ErrHelp) {
		writeHelp(stdout)
		return exitOK
	}
	var name, reason string
	if err == nil {
		name, reason, err = chooseTransport(c)
	}
	if err == nil && !c.child {
		err = c.preflight(name)
	}
	if err != nil {
		return failed(stdout, stderr, wantsJSON(args), exitUsage, err)
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
		if c.hostEtcd != "" {
			sweepLeftovers(u) // this rank serves the rendezvous, as a local launcher does
		}
		res, err := runProcessRank(ctx, c, name, tracer, u.event)
		if res == nil {
			res = &rankResult{Rank: c.rank}
		}
		res.PeakRSS = peakRSS()
		res.Error = errString(err)
		results = []*rankResult{res}
	case inProcess(name):
		mode = inprocMode
		u.say("weightcast demo: %s in one process, transport inproc, %s, %s buckets, %s",
			plural(c.ranks, "rank"), c.modelText(), sizeText(c.bucket), plural(c.rounds, "round"))
		results = runInProcess(ctx, c, tracer, u.event)
		for _, r := range results {
			r.PeakRSS = peakRSS() // one process: the same figure for all
		}
	default:
		mode = "local processes"
		u.say("weightcast demo: starting %s, transport %s (%s), %s, %s buckets, %s",
			plural(c.ranks, "rank process"), name, reason, c.modelText(), sizeText(c.bucket), plural(c.rounds, "round"))
		results, err = launchLocal(ctx, c, name, tracer, u)
		if err != nil {
			status := exitFailed
			if sig, ok := stoppedBy(ctx); ok {
				status = sig.exitStatus()
			}
			return failed(stdout, stderr, c.json, status, err)
		}
	}
	if sig, ok := stoppedBy(ctx); ok {
		for _, r := range results {
			if r != nil && !r.Unreported && r.Stopped == "" && r.Error != "" {
				r.Stopped = signalName(sig.sig) // a rank of this process: its round saw the signal
			}
		}
	}

	s := summarize(c, name, reason, mode, results)
	if sig, ok := stoppedBy(ctx); ok {
		s.stop(sig)
	}
	if tracer != nil {
		traced, err := writeTrace(c, tracer, args, name)
		if traced {
			s.Trace = c.trace
		}
		if err != nil {
			s.traceFailed(err)
		} else {
			s.Timeline = c.timeline
		}
	}
	if c.json {
		s.writeJSON(stdout)
	} else {
		s.writeTable(stdout)
	}
	return s.ExitStatus
}

// failed reports an error that left no summary to print: on stderr, and with
// --json as the one JSON object on stdout. It returns status.
func failed(stdout, stderr io.Writer, asJSON bool, status int, err error) int {
	fmt.Fprintf(stderr, "demo: %v\n", err)
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			Error      string `json:"error"`
			ExitStatus int    `json:"exit_status"`
		}{err.Error(), status})
	}
	return status
}

// chooseTransport resolves --transport auto and says why, as the library
// does (transport.Choose) but before any rank starts: from this host's
// facts as every local rank would publish them (its GPUs, or those
// --devices names, and what each registered transport adds), among the
// transports that can route when the run is routed.
func chooseTransport(c *config) (name, reason string, err error) {
	if c.transport != "auto" {
		d, ok := transport.Lookup(c.transport)
		if !ok {
			return "", "", fmt.Errorf("--transport %s is not available in this build (available: %s)", c.transport, strings.Join(transport.Names(), ", "))
		}
		if d.DeviceMemory {
			if _, err := c.gpuList(); err != nil {
				return "", "", fmt.Errorf("--transport %s needs a GPU: %v; use --transport tcp on machines without one", c.transport, err)
			}
		}
		return c.transport, "chosen with --transport", nil
	}
	n, err := gpu.DeviceCount()
	why := "" // why this host offers no GPU
	switch {
	case errors.Is(err, gpu.ErrNoCgo):
		why, n = "this binary was built without cgo, so it cannot use GPUs", 0
	case errors.Is(err, gpu.ErrNoDriver):
		why, n = "no NVIDIA driver on this machine", 0
	case err != nil:
		why, n = fmt.Sprintf("no usable GPU: %v", err), 0
	case n == 0:
		why = "no GPU visible"
	case len(c.devices) > 0:
		n = len(c.devices)
	}
	facts := map[string]string{transport.FactHost: transport.HostIdentity(), transport.FactGPUs: strconv.Itoa(n)}
	for _, d := range transport.Descriptors() {
		if d.Facts != nil {
			maps.Copy(facts, d.Facts(transport.Probe{GPUs: n, Auto: true}))
		}
	}
	peers := make([]transport.Peer, c.ranks)
	for r := range peers {
		peers[r] = transport.Peer{Rank: r, Facts: facts}
	}
	cands := transport.Candidates()
	if c.routed() {
		cands = slices.DeleteFunc(cands, func(d transport.Descriptor) bool { return d.OpenPairs == nil })
	}
	d, reason, err := transport.ChooseAmong(cands, peers)
	if err != nil {
		return "", "", fmt.Errorf("--transport auto: %w", err)
	}
	if why != "" {
		reason = why
	}
	return d.Name, reason, nil
}

// writeTrace writes the merged trace and, when asked, its timeline. traced
// says the trace file --trace names was written.
func writeTrace(c *config, tracer *pipeline.Tracer, args []string, transportName string) (traced bool, err error) {
	path := c.trace
	if path == "" {
		f, err := os.CreateTemp("", "weightcast-trace-*.json")
		if err != nil {
			return false, fmt.Errorf("writing the trace for the timeline: %w", err)
		}
		path = f.Name()
		f.Close()
		defer os.Remove(path)
	}
	f, err := os.Create(path)
	if err != nil {
		return false, fmt.Errorf("writing the trace: %w", err)
	}
	other := map[string]any{"command": "demo " + strings.Join(args, " "), "transport": transportName}
	if err := tracer.WriteChrome(f, other); err != nil {
		f.Close()
		return false, fmt.Errorf("writing the trace %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return false, fmt.Errorf("writing the trace %s: %w", path, err)
	}
	traced = c.trace != ""
	if c.timeline != "" {
		title := fmt.Sprintf("weightcast: %d ranks, %s, %s, %s buckets", c.ranks, transportName, c.modelText(), sizeText(c.bucket))
		if err := timeline.RenderFile(path, c.timeline, timeline.Options{Title: title}); err != nil {
			return traced, fmt.Errorf("drawing the timeline: %w", err)
		}
	}
	return traced, nil
}
