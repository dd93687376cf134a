package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
)

// graceAfterFailure is how long the launcher lets the other ranks notice a
// failed rank and exit on their own before it kills them.
const graceAfterFailure = 45 * time.Second

// launchLocal starts an embedded etcd and one process per rank, relays
// their progress, and collects their results. Trace events of every rank
// are merged into tracer.
func launchLocal(ctx context.Context, c *config, transportName string, tracer *pipeline.Tracer, u *ui) ([]*rankResult, error) {
	emb, err := embedetcd.Start(ctx, embedetcd.Options{})
	if err != nil {
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
	dir, err := os.MkdirTemp("", "weightcast-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if tracer != nil {
		c.traceEpoch = tracer.Epoch().UnixNano()
	}
	c.transport = transportName

	results := make([]*rankResult, c.ranks)
	cmds := make([]*exec.Cmd, c.ranks)
	traces := make([]string, c.ranks)
	relays := make([]*sync.WaitGroup, c.ranks)
	for r := range c.ranks {
		if tracer != nil {
			traces[r] = filepath.Join(dir, fmt.Sprintf("rank%d.trace.json", r))
		}
		cmd := exec.Command(exe, c.childArgs(r, endpoint, traces[r])...)
		cmd.Env = append(os.Environ(), "NCCL_NVLS_ENABLE=0")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			killAll(cmds, nil)
			return nil, fmt.Errorf("starting rank %d: %w", r, err)
		}
		cmds[r] = cmd
		relays[r] = new(sync.WaitGroup)
		relays[r].Go(func() {
			readEvents(stdout, func(ev event) {
				if ev.Type == "result" && ev.Result != nil {
					results[r] = ev.Result
				} else {
					u.event(ev)
				}
			})
		})
		relays[r].Go(func() { relayLines(stderr, u) })
	}

	waited := make(chan int, c.ranks)
	exitErrs := make([]error, c.ranks)
	for r, cmd := range cmds {
		go func() {
			// Wait closes the pipes: read them to the end first.
			relays[r].Wait()
			exitErrs[r] = cmd.Wait()
			waited <- r
		}()
	}
	var grace <-chan time.Time
	exited := make([]bool, c.ranks)
	killed := map[int]bool{}
	done := ctx.Done()
	for left := c.ranks; left > 0; {
		select {
		case r := <-waited:
			left--
			exited[r] = true
			if exitErrs[r] != nil && grace == nil {
				grace = time.After(graceAfterFailure)
			}
		case <-grace:
			for r := range cmds {
				if !exited[r] {
					killed[r] = true
				}
			}
			killAll(cmds, exited)
			grace = nil
		case <-done:
			killAll(cmds, exited)
			done = nil // wait for the exits
		}
	}
	for r := range results {
		if results[r] == nil {
			results[r] = &rankResult{Rank: r, Error: fmt.Sprintf("rank process exited without a result: %v", exitErrs[r])}
		}
		if killed[r] && results[r].Error == "" {
			results[r].Error = fmt.Sprintf("killed by the launcher %v after another rank failed", graceAfterFailure)
		}
	}
	if tracer != nil {
		for _, path := range traces {
			f, err := os.Open(path)
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

// killAll kills every started rank process that has not exited.
func killAll(cmds []*exec.Cmd, exited []bool) {
	for r, cmd := range cmds {
		if cmd != nil && cmd.Process != nil && (exited == nil || !exited[r]) {
			cmd.Process.Kill()
		}
	}
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
