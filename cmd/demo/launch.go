package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/weightcast/weightcast/internal/owned"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
)

// How a local launch ends when it does not end by itself.
const (
	// graceAfterFailure is how long the launcher lets the other ranks
	// notice a failed rank and exit on their own before it kills them.
	graceAfterFailure = 45 * time.Second
	// stopGrace is how long ranks asked to stop (SIGTERM, forwarded from
	// the launcher's SIGINT or SIGTERM) have to abort their round and
	// report before the launcher kills them.
	stopGrace = 5 * time.Second
)

// workDirPrefix starts the name of a local launch's work directory in
// TMPDIR (the ranks' trace files).
const workDirPrefix = "weightcast-demo-"

// launchLocal starts an embedded etcd and one process per rank, relays
// their progress, and collects their results. Trace events of every rank
// are merged into tracer. When ctx ends (SIGINT or SIGTERM), it asks every
// rank to stop, waits up to stopGrace, kills what is left and returns what
// the ranks reported. First it removes what killed launches left in TMPDIR.
func launchLocal(ctx context.Context, c *config, transportName string, tracer *pipeline.Tracer, u *ui) ([]*rankResult, error) {
	sweepLeftovers(u)
	dir, err := owned.MkdirTemp(workDirPrefix)
	if err != nil {
		return nil, fmt.Errorf("making the launcher's work directory: %w", err)
	}
	defer os.RemoveAll(dir)
	emb, err := embedetcd.Start(ctx, embedetcd.Options{TLS: c.tlsFiles})
	if err != nil {
		if sig, ok := stoppedBy(ctx); ok {
			return nil, sig
		}
		return nil, fmt.Errorf("starting the embedded etcd: %w", err)
	}
	defer emb.Close()
	endpoint := strings.TrimPrefix(strings.TrimPrefix(emb.ClientURL(), "http://"), "https://")
	if c.runID == "" {
		var b [6]byte
		rand.Read(b[:])
		c.runID = hex.EncodeToString(b[:])
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this program to start the ranks: %w", err)
	}
	if tracer != nil {
		c.traceEpoch = tracer.Epoch().UnixNano()
	}
	c.transport = transportName

	children := make([]*child, c.ranks)
	exited := make(chan *child, c.ranks)
	for r := range c.ranks {
		ch := &child{rank: r}
		if tracer != nil {
			ch.trace = filepath.Join(dir, fmt.Sprintf("rank%d.trace.json", r))
		}
		ch.cmd = exec.Command(exe, c.childArgs(r, endpoint, ch.trace)...)
		ch.cmd.Env = append(os.Environ(), "NCCL_NVLS_ENABLE=0")
		ch.cmd.SysProcAttr = childProcAttr()
		started := make(chan error, 1)
		go ch.run(u, started, exited)
		if err := <-started; err != nil {
			// The ranks started so far would wait for this one until
			// --timeout: end them now.
			left := 0
			for _, o := range children[:r] {
				o.cmd.Process.Kill()
				left++
			}
			for range left {
				<-exited
			}
			return nil, fmt.Errorf("starting rank %d: %w", r, err)
		}
		children[r] = ch
	}
	supervise(ctx, children, exited)

	results := make([]*rankResult, c.ranks)
	for r, ch := range children {
		results[r] = ch.report()
	}
	if tracer != nil {
		for _, ch := range children {
			f, err := os.Open(ch.trace)
			if err != nil {
				continue // a rank killed before writing its trace
			}
			evs, _, err := pipeline.ReadChrome(f)
			f.Close()
			if err == nil {
				tracer.Add(evs...)
			}
		}
	}
	return results, nil
}

// sweepLeftovers removes from TMPDIR the work and etcd directories of
// launches whose process was killed, and says what it removed.
func sweepLeftovers(u *ui) {
	removed, err := owned.Sweep(workDirPrefix, embedetcd.DirPrefix)
	if len(removed) > 0 {
		u.say("weightcast demo: removed %s that killed launches left: %s", plural(len(removed), "directory"), strings.Join(removed, ", "))
	}
	if err != nil {
		u.say("weightcast demo: could not remove what killed launches left: %v", err)
	}
}

// supervise waits for every child to exit. After a rank fails it gives the
// others graceAfterFailure to follow, then kills them; when ctx ends it
// forwards SIGTERM to every rank and kills what is left after stopGrace.
func supervise(ctx context.Context, children []*child, exited <-chan *child) {
	var grace, kill <-chan time.Time
	done := ctx.Done()
	killLeft := func(why string) {
		for _, ch := range children {
			if !ch.exited {
				ch.killed = why
				ch.cmd.Process.Kill()
			}
		}
	}
	for left := len(children); left > 0; {
		select {
		case ch := <-exited:
			left--
			ch.exited = true
			if ch.exit != nil && grace == nil && kill == nil {
				grace = time.After(graceAfterFailure)
			}
		case <-grace:
			grace = nil
			killLeft(fmt.Sprintf("killed by the launcher %v after another rank failed", graceAfterFailure))
		case <-done:
			done, grace = nil, nil
			for _, ch := range children {
				if !ch.exited {
					ch.cmd.Process.Signal(syscall.SIGTERM)
				}
			}
			kill = time.After(stopGrace)
		case <-kill:
			kill = nil
			killLeft(fmt.Sprintf("did not stop within %v of SIGTERM; killed by the launcher", stopGrace))
		}
	}
}

// child is one rank process of a local launch.
type child struct {
	rank  int
	cmd   *exec.Cmd
	trace string // where it writes its trace events; "" for none

	// Set by run before it sends the child on exited.
	result *rankResult // its report, if it made one
	exit   error       // from Wait

	// Owned by supervise.
	exited bool
	killed string // why the launcher killed it
}

// run starts the child, relays its output to u and waits for it to exit;
// it sends Start's error on started, then the child on exited once it has
// exited. The whole life of the child runs on one locked OS thread: Linux
// sends the child its Pdeathsig when the thread that started it ends, not
// only when the launcher does, and a locked thread cannot be taken over
// and ended by another goroutine.
func (ch *child) run(u *ui, started chan<- error, exited chan<- *child) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The child reads its standard input to the end: EOF means the
	// launcher is gone. Wait closes this end once the child has exited.
	if _, err := ch.cmd.StdinPipe(); err != nil {
		started <- err
		return
	}
	stdout, err := ch.cmd.StdoutPipe()
	if err != nil {
		started <- err
		return
	}
	stderr, err := ch.cmd.StderrPipe()
	if err != nil {
		started <- err
		return
	}
	if err := ch.cmd.Start(); err != nil {
		started <- err
		return
	}
	started <- nil
	var relay sync.WaitGroup
	relay.Go(func() {
		readEvents(stdout, func(ev event) {
			if ev.Type == "result" && ev.Result != nil {
				ch.result = ev.Result
			} else {
				u.event(ev)
			}
		})
	})
	relay.Go(func() { relayLines(stderr, u) })
	relay.Wait() // Wait closes the pipes: read them to the end first
	ch.exit = ch.cmd.Wait()
	exited <- ch
}

// report is the child's result, or, when it made none, what is known: how
// its process ended.
func (ch *child) report() *rankResult {
	if ch.result != nil {
		return ch.result
	}
	why := ch.killed
	if why == "" {
		why = exitText(ch.exit)
	}
	return &rankResult{Rank: ch.rank, Unreported: true, Error: why}
}

// exitText says how a process that did not report ended.
func exitText(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "the rank's process exited without reporting"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("the rank's process was killed by %s before it reported", signalName(ws.Signal()))
		}
		return fmt.Sprintf("the rank's process exited with status %d without reporting", ee.ExitCode())
	}
	return fmt.Sprintf("the rank's process ended without reporting: %v", err)
}

// readEvents decodes a rank's JSON lines.
func readEvents(r io.Reader, fn func(event)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev event
		if json.Unmarshal(sc.Bytes(), &ev) == nil {
			fn(ev)
		}
	}
}

// relayLines copies a rank's standard error to ours, line by line.
func relayLines(r io.Reader, u *ui) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		u.line(sc.Text())
	}
}
