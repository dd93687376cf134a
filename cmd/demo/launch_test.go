package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/internal/owned"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
)

// These tests run the demo's local launcher as a real process, the way a
// user does, and break it: bad flags and inputs, signals, a killed rank, a
// killed launcher, a trace that cannot be written. Each asserts the exit
// status, the time to exit, what is left in TMPDIR and what the summary
// claims.

// launch is one run of the demo's local launcher.
type launch struct {
	cmd     *exec.Cmd
	tmp     string // its TMPDIR
	stdout  bytes.Buffer
	stderr  bytes.Buffer // every line of its standard error
	lines   chan string  // the same lines as they come; closed at EOF
	done    chan struct{}
	exit    error
	exitAt  time.Time
	started time.Time
}

// startLaunch starts the demo with args and TMPDIR set to tmp (a fresh one
// when empty).
func startLaunch(t *testing.T, tmp string, args ...string) *launch {
	t.Helper()
	if tmp == "" {
		tmp = t.TempDir()
	}
	l := &launch{cmd: exec.Command(demoBin, args...), tmp: tmp, lines: make(chan string, 1024), done: make(chan struct{})}
	l.cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	l.cmd.Stdout = &l.stdout
	stderr, err := l.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	l.started = time.Now()
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			l.stderr.WriteString(sc.Text() + "\n")
			select {
			case l.lines <- sc.Text():
			default: // nobody is waiting for lines
			}
		}
		close(l.lines)
		l.exit = l.cmd.Wait()
		l.exitAt = time.Now()
		close(l.done)
	}()
	t.Cleanup(func() {
		l.cmd.Process.Kill()
		<-l.done
	})
	return l
}

// waitLine waits up to d for a line of the launcher's standard error that
// contains s.
func (l *launch) waitLine(t *testing.T, s string, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				<-l.done
				t.Fatalf("the launcher exited (%v) before printing %q:\n%s%s", l.exit, s, l.stderr.String(), l.stdout.String())
			}
			if strings.Contains(line, s) {
				return
			}
		case <-deadline:
			t.Fatalf("no %q from the launcher within %v", s, d)
		}
	}
}

// wait waits up to d for the launcher to exit and returns its exit status.
func (l *launch) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	go func() {
		for range l.lines { // keep the pipe flowing
		}
	}()
	select {
	case <-l.done:
	case <-time.After(d):
		l.cmd.Process.Kill()
		<-l.done
		t.Fatalf("the launcher still ran after %v; stderr:\n%s", d, l.stderr.String())
	}
	if l.exit == nil {
		return 0
	}
	var ee *exec.ExitError
	if !errors.As(l.exit, &ee) {
		t.Fatalf("waiting for the launcher: %v", l.exit)
	}
	return ee.ExitCode()
}

// summary decodes the launcher's --json output, which must be exactly one
// JSON object.
func (l *launch) summary(t *testing.T) summary {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(l.stdout.Bytes()))
	var s summary
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("bad JSON summary (%v): %s\nstderr: %s", err, l.stdout.String(), l.stderr.String())
	}
	if dec.More() {
		t.Fatalf("more than one JSON object on stdout: %s", l.stdout.String())
	}
	return s
}

// rankPIDs finds the launcher's rank processes: its children, by rank.
func (l *launch) rankPIDs(t *testing.T) map[int]int {
	t.Helper()
	ranks := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(l.cmd.Process.Pid) {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		for i, a := range args {
			if a == "--rank" && i+1 < len(args) {
				if r, err := strconv.Atoi(args[i+1]); err == nil {
					ranks[r] = pid
				}
			}
		}
	}
	return ranks
}

// running reports whether pid is a live process (not a zombie).
func running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// leftovers lists what weightcast left in dir (a TMPDIR): the entries
// whose names start with "weightcast-".
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "weightcast-") {
			names = append(names, e.Name())
		}
	}
	return names
}

// long is a local launch that runs until stopped: small rounds, many of them.
var long = []string{"--ranks", "4", "--size", "16MiB", "--tensors", "30", "--bucket", "1MiB", "--rounds", "100000", "--timeout", "60s"}

// TestUsageErrors: a flag or input the demo cannot use fails at once, before
// any rank or etcd starts: exit 2, one line on stderr that says what is
// wrong, nothing left in TMPDIR; with --json, also exactly one JSON object on
// stdout with the error. (Before: --model notes.txt took 7.3 s and four
// processes, --group a/b exited 1, --ranks 100000 forked until refused.)
func TestUsageErrors(t *testing.T) {
	notes := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(notes, []byte("remember the milk\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string // in the message
	}{
		{[]string{"--model", notes}, "--model " + notes + ": safetensors"},
		{[]string{"--group", "a/b"}, `--group "a/b": a group name must be`},
		{[]string{"--run-id", "a b"}, `--run-id "a b"`},
		{[]string{"--ranks", "100000"}, "at most 64"},
		{[]string{"--ranks", "1"}, "--ranks 1: a sync needs a sender and at least one receiver"},
		{[]string{"--size", "2PiB"}, "--size 2PiB is over the limit of 1.0 PiB"},
		{[]string{"--bucket", "100"}, "--bucket 100 is below the minimum of 1.0 KiB"},
		{[]string{"--trace", "/proc/t.json"}, "--trace /proc/t.json: cannot write in /proc"},
		{[]string{"--timeline", "/proc/t.svg"}, "--timeline /proc/t.svg: cannot write in /proc"},
		{[]string{"--out", "/proc/out"}, "--out /proc/out"},
		{[]string{"--bogus"}, "unknown flag --bogus; see --help"},
		{[]string{"-ranks", "3"}, "flags take two dashes (--ranks)"},
		{[]string{"--ranks", "many"}, `--ranks "many": want a whole number`},
		{[]string{"--timeout"}, "--timeout needs a value"},
		{[]string{"stray"}, `unexpected argument "stray"`},
	}
	for _, tc := range cases {
		for _, asJSON := range []bool{false, true} {
			args := tc.args
			if asJSON {
				args = append([]string{"--json"}, args...)
			}
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				l := startLaunch(t, "", args...)
				// Well under a second on an idle machine (a few ms); the
				// bound leaves room for a loaded one, and is far below
				// what starting ranks takes.
				if code := l.wait(t, 30*time.Second); code != 2 {
					t.Fatalf("exit status %d, want 2; stderr:\n%s", code, l.stderr.String())
				}
				if took := l.exitAt.Sub(l.started); took > 2*time.Second {
					t.Errorf("took %v to refuse", took)
				}
				msg := strings.TrimSuffix(l.stderr.String(), "\n")
				if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "demo: ") || !strings.Contains(msg, tc.want) {
					t.Errorf("stderr is not one line naming the problem (%q):\n%s", tc.want, msg)
				}
				if len(msg) > 300 {
					t.Errorf("message of %d characters: %s", len(msg), msg)
				}
				if left := leftovers(t, l.tmp); len(left) > 0 {
					t.Errorf("TMPDIR holds %v after a usage error", left)
				}
				if !asJSON {
					if l.stdout.Len() > 0 {
						t.Errorf("stdout: %s", l.stdout.String())
					}
					return
				}
				s := l.summary(t)
				if s.ExitStatus != 2 || "demo: "+s.Error != msg {
					t.Errorf("JSON error %q, exit_status %d; want the message on stderr and 2", s.Error, s.ExitStatus)
				}
			})
		}
	}
}

// TestHelp: --help prints on stdout what the demo does and every flag in
// --flag form with its default, without the internal flags, and exits 0.
func TestHelp(t *testing.T) {
	for _, flag := range []string{"--help", "-h"} {
		l := startLaunch(t, "", flag)
		if code := l.wait(t, 30*time.Second); code != 0 {
			t.Fatalf("%s: exit status %d", flag, code)
		}
		help := l.stdout.String()
		for _, want := range []string{"--ranks N", "(default 4)", "--json", "--trace FILE", "--timeout DURATION", "(default 2m0s)", "Exit status", "130"} {
			if !strings.Contains(help, want) {
				t.Errorf("%s: help lacks %q:\n%s", flag, want, help)
			}
		}
		for _, internal := range []string{"--child", "--trace-epoch", "--trace-out", " -ranks"} {
			if strings.Contains(help, internal) {
				t.Errorf("%s: help shows %q", flag, internal)
			}
		}
		if l.stderr.Len() > 0 {
			t.Errorf("%s: stderr: %s", flag, l.stderr.String())
		}
	}
}

// TestStopSignals: SIGINT (Ctrl-C) or SIGTERM after two committed rounds.
// The launcher asks its ranks to stop, they abort their round and report,
// and it exits 130 or 143 within a few seconds with a summary of what each
// rank committed: no rank killed, no "signal: killed", nothing left in
// TMPDIR, no rank process left. (Before: children SIGKILLed, exit 1,
// "committed: version 0".)
func TestStopSignals(t *testing.T) {
	for _, tc := range []struct {
		sig    syscall.Signal
		name   string
		status int
		json   bool
	}{{syscall.SIGINT, "SIGINT", 130, false}, {syscall.SIGTERM, "SIGTERM", 143, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := long
			if tc.json {
				args = append([]string{"--json"}, long...)
			}
			l := startLaunch(t, "", args...)
			l.waitLine(t, "round 2/", 60*time.Second)
			pids := l.rankPIDs(t)
			if len(pids) != 4 {
				t.Fatalf("found rank processes %v, want 4", pids)
			}
			sent := time.Now()
			l.cmd.Process.Signal(tc.sig)
			if code := l.wait(t, 30*time.Second); code != tc.status {
				t.Fatalf("exit status %d, want %d; stderr:\n%s", code, tc.status, l.stderr.String())
			}
			took := l.exitAt.Sub(sent)
			t.Logf("exited %v after the %s", took.Round(time.Millisecond), tc.name)
			if took > stopGrace {
				t.Errorf("took %v to stop, more than the %v the ranks are given", took, stopGrace)
			}
			for r, pid := range pids {
				if running(pid) {
					t.Errorf("rank %d (pid %d) still runs", r, pid)
				}
			}
			if left := leftovers(t, l.tmp); len(left) > 0 {
				t.Errorf("TMPDIR holds %v after a clean stop", left)
			}
			all := l.stdout.String() + l.stderr.String()
			if strings.Contains(all, "signal: killed") || strings.Contains(all, "killed by") {
				t.Errorf("output speaks of kills:\n%s", all)
			}
			if !tc.json {
				out := l.stdout.String()
				if !strings.Contains(out, "STOPPED by "+tc.name+" during round ") || strings.Contains(out, "FAILED") {
					t.Errorf("the table does not say the run was stopped by %s, and only that:\n%s", tc.name, out)
				}
				if strings.Contains(out, "committed:     version 0") || strings.Contains(out, "checksums:     every bucket, checked") {
					t.Errorf("the table claims what did not happen:\n%s", out)
				}
				return
			}
			s := l.summary(t)
			if s.Stopped != tc.name || s.ExitStatus != tc.status || s.Committed == nil || *s.Committed < 2 || s.Verified {
				t.Fatalf("summary: stopped %q, exit %d, committed %v, verified %v", s.Stopped, s.ExitStatus, s.Committed, s.Verified)
			}
			if len(s.Seconds) != int(*s.Committed) {
				t.Errorf("%d round times for %d committed versions", len(s.Seconds), *s.Committed)
			}
			for _, r := range s.PerRank {
				if r.Unreported || r.Stopped != "SIGTERM" {
					t.Errorf("rank %d: unreported %v, stopped %q; want a report of a SIGTERM stop", r.Rank, r.Unreported, r.Stopped)
				}
				if r.CommittedVersion < *s.Committed || r.CommittedVersion > *s.Committed+1 {
					t.Errorf("rank %d committed version %d, the sender %d", r.Rank, r.CommittedVersion, *s.Committed)
				}
			}
		})
	}
}

// TestKilledReceiver: a receiver killed with SIGKILL mid-run. The launcher
// exits 1 with a summary that gives the survivors' committed version (not
// 0), marks the killed rank as unreported, times only finished rounds and
// claims checksums only for committed versions.
func TestKilledReceiver(t *testing.T) {
	l := startLaunch(t, "", append([]string{"--json"}, long...)...)
	l.waitLine(t, "round 2/", 60*time.Second)
	pids := l.rankPIDs(t)
	if err := syscall.Kill(pids[2], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if code := l.wait(t, 60*time.Second); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	t.Logf("exited %v after the kill", l.exitAt.Sub(killed).Round(time.Millisecond))
	s := l.summary(t)
	if s.Error == "" || s.Verified || s.ExitStatus != 1 || s.Committed == nil || *s.Committed < 2 {
		t.Fatalf("summary: error %q, verified %v, exit %d, committed %v", s.Error, s.Verified, s.ExitStatus, s.Committed)
	}
	if len(s.Seconds) != int(*s.Committed) {
		t.Errorf("%d round times for %d committed versions: a rate for a round that did not finish", len(s.Seconds), *s.Committed)
	}
	for _, r := range s.PerRank {
		switch {
		case r.Rank == 2:
			if !r.Unreported || !strings.Contains(r.Error, "SIGKILL") {
				t.Errorf("killed rank: unreported %v, error %q", r.Unreported, r.Error)
			}
		case r.Unreported || r.Error == "":
			t.Errorf("rank %d: unreported %v, error %q", r.Rank, r.Unreported, r.Error)
		case r.CommittedVersion < *s.Committed || r.CommittedVersion > *s.Committed+1:
			t.Errorf("rank %d committed version %d, the sender %d", r.Rank, r.CommittedVersion, *s.Committed)
		}
	}
	if left := leftovers(t, l.tmp); len(left) > 0 {
		t.Errorf("TMPDIR holds %v", left)
	}
}

// TestKilledLauncher: the launcher killed with SIGKILL. Its rank processes
// end within a few seconds (Pdeathsig, and their standard input's end);
// what it left in TMPDIR (the etcd data, its work directory) is removed by
// the next launch, and a live owner's directory is not. (Before: orphans
// ran on for about 11 s; a 123 MB etcd directory stayed.)
func TestKilledLauncher(t *testing.T) {
	tmp := t.TempDir()
	l := startLaunch(t, tmp, long...)
	l.waitLine(t, "round 1/", 60*time.Second)
	pids := l.rankPIDs(t)
	if len(pids) != 4 {
		t.Fatalf("found rank processes %v, want 4", pids)
	}
	l.cmd.Process.Kill()
	killed := time.Now()
	l.wait(t, 30*time.Second)
	for r, pid := range pids {
		for running(pid) {
			if time.Since(killed) > 5*time.Second {
				t.Fatalf("rank %d (pid %d) still runs 5s after its launcher was killed", r, pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Logf("every rank had exited %v after the launcher was killed", time.Since(killed).Round(time.Millisecond))

	left := leftovers(t, tmp)
	var etcd, work int
	for _, name := range left {
		switch {
		case strings.HasPrefix(name, embedetcd.DirPrefix):
			etcd++
		case strings.HasPrefix(name, workDirPrefix):
			work++
		}
	}
	if etcd != 1 || work != 1 {
		t.Fatalf("a killed launcher left %v; want one etcd and one work directory", left)
	}
	// A live process's directory, which the next launch must keep.
	t.Setenv("TMPDIR", tmp)
	live, err := owned.MkdirTemp(workDirPrefix)
	if err != nil {
		t.Fatal(err)
	}

	next := startLaunch(t, tmp, "--ranks", "2", "--size", "1MiB", "--tensors", "10", "--bucket", "64KiB", "--rounds", "1")
	if code := next.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("the next launch: exit status %d\n%s", code, next.stderr.String())
	}
	if !strings.Contains(next.stderr.String(), "removed 2 directories that killed launches left") {
		t.Errorf("the next launch does not say what it removed:\n%s", next.stderr.String())
	}
	if after := leftovers(t, tmp); len(after) != 1 || after[0] != filepath.Base(live) {
		t.Fatalf("after the next launch TMPDIR holds %v; want only the live %s", after, filepath.Base(live))
	}
}

// TestTraceNotWritten: a trace whose directory vanishes during the run is
// reported as not written, and the sync's own verdict stands: every byte
// verified. The summary names no trace file. (Before: "verified: no, the
// run failed" and the unwritten trace named.)
func TestTraceNotWritten(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "traces")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(dir, "t.json")
	l := startLaunch(t, "", "--ranks", "3", "--size", "16MiB", "--tensors", "30", "--bucket", "1MiB", "--rounds", "50", "--trace", trace)
	l.waitLine(t, "round 1/", 60*time.Second)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if code := l.wait(t, 120*time.Second); code != 1 {
		t.Fatalf("exit status %d, want 1", code)
	}
	out := l.stdout.String()
	for _, want := range []string{"verified:      yes, every byte on 2 receivers", "checksums:     every bucket, checked by every receiver",
		"trace:         not written: writing the trace: open " + trace, "FAILED:\n  writing the trace"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "(open in https://ui.perfetto.dev") {
		t.Errorf("summary names the unwritten trace:\n%s", out)
	}
}
