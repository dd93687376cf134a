package owned

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// FileName is the owner file in every directory MkdirTemp makes.
const FileName = ".weightcast-owner"

// owner identifies a process: its pid, and where /proc tells them, its
// start time since boot (in clock ticks) and its pid namespace.
type owner struct {
	pid   int
	start string // "": unknown
	pidNS string // "": unknown
}

// self is the calling process.
func self() owner {
	pid := os.Getpid()
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return owner{pid: pid, start: startTime(pid), pidNS: ns}
}

// MkdirTemp makes a new directory in the default directory for temporary
// files (os.TempDir), named after pattern as os.MkdirTemp names it, and
// records this process as its owner. The caller removes it when done; if
// this process is killed first, Sweep removes it later.
func MkdirTemp(pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	o := self()
	text := fmt.Sprintf("pid %d\nstart %s\npidns %s\n", o.pid, o.start, o.pidNS)
	if err := os.WriteFile(filepath.Join(dir, FileName), []byte(text), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("recording the owner of %s: %w", dir, err)
	}
	return dir, nil
}

// Sweep removes the directories in os.TempDir whose names start with one
// of prefixes, that MkdirTemp made, and whose owner process has ended. It
// returns the directories it removed; its error joins those it could not
// remove.
func Sweep(prefixes ...string) ([]string, error) {
	tmp := os.TempDir()
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return nil, err
	}
	me := self()
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !hasAnyPrefix(e.Name(), prefixes) {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		o, ok := readOwner(dir)
		if !ok || !gone(o, me) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, dir)
	}
	return removed, errors.Join(errs...)
}

func hasAnyPrefix(name string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// readOwner reads dir's owner file; ok is false when there is none, it is
// malformed, or dir belongs to another user.
func readOwner(dir string) (o owner, ok bool) {
	if st, err := os.Stat(dir); err != nil {
		return o, false
	} else if sys, isUnix := st.Sys().(*syscall.Stat_t); isUnix && int(sys.Uid) != os.Getuid() {
		return o, false
	}
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		return o, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		key, value, _ := strings.Cut(line, " ")
		switch key {
		case "pid":
			o.pid, err = strconv.Atoi(value)
			if err != nil {
				return o, false
			}
		case "start":
			o.start = value
		case "pidns":
			o.pidNS = value
		}
	}
	return o, o.pid > 0
}

// gone reports whether o has ended, as seen by me. A process of another
// pid namespace, or whose namespace is unknown while ours is known, is
// never judged gone: its pid means nothing here.
func gone(o, me owner) bool {
	if o.pidNS != me.pidNS {
		return false
	}
	if _, err := os.Stat("/proc/self/stat"); err == nil {
		// /proc tells ended, zombie and recycled pids apart.
		st, err := os.ReadFile("/proc/" + strconv.Itoa(o.pid) + "/stat")
		if errors.Is(err, os.ErrNotExist) {
			return true
		}
		if err != nil {
			return false
		}
		state, start, ok := parseStat(string(st))
		if !ok {
			return false
		}
		return state == "Z" || state == "X" || (o.start != "" && start != o.start)
	}
	return errors.Is(syscall.Kill(o.pid, 0), syscall.ESRCH)
}

// startTime is pid's start time since boot, in clock ticks, from
// /proc/PID/stat; "" where that cannot be read.
func startTime(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	_, start, _ := parseStat(string(b))
	return start
}

// parseStat returns the state (field 3) and start time (field 22) of a
// /proc/PID/stat line. The command name (field 2) is in parentheses and
// may hold spaces and parentheses itself, so fields are counted from the
// last ')'.
func parseStat(s string) (state, start string, ok bool) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "", "", false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "", "", false
	}
	return f[0], f[19], true
}

// Process identifies a process of this host for a later judgement of
// whether it still runs: its pid, and, where /proc tells them, its start
// time since boot in clock ticks (so that a recycled pid is not taken for
// it) and its pid namespace (so that a process of another namespace, where
// pids mean other processes, never judges it). Empty fields are unknown.
type Process struct {
	PID   int
	Start string
	PIDNS string
}

// Self is the calling process.
func Self() Process {
	o := self()
	return Process{PID: o.pid, Start: o.start, PIDNS: o.pidNS}
}

// Ended reports whether p, a process of this host, has ended as seen from
// this process: its pid is gone (kill(pid, 0) fails with ESRCH, or /proc
// has no such pid), or it is a zombie, or the pid now names a process that
// started at another time. It is false whenever that cannot be told: a pid
// of another pid namespace, or of one not known while ours is.
func (p Process) Ended() bool {
	if p.PID <= 0 {
		return false
	}
	return gone(owner{pid: p.PID, start: p.Start, pidNS: p.PIDNS}, self())
}
