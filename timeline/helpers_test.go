package timeline

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

// ev is a trace event under construction in tests.
type ev map[string]any

// traceJSON returns a JSON Object Format trace holding events.
func traceJSON(t testing.TB, events ...ev) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"traceEvents": events, "displayTimeUnit": "ms"})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// span is a complete event of the weightcast convention.
func span(pid, tid int, stage string, bucket int, ts, dur float64) ev {
	args := map[string]any{"stage": stage, "rank": pid}
	name := stage
	if bucket >= 0 {
		args["bucket"] = bucket
		args["bytes"] = 1 << 20
		name = fmt.Sprintf("bucket %d", bucket)
	}
	return ev{"name": name, "cat": stage, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}
}

func threadName(pid, tid int, name string) ev {
	return ev{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": map[string]any{"name": name}}
}

func processName(pid int, name string) ev {
	return ev{"name": "process_name", "ph": "M", "pid": pid, "args": map[string]any{"name": name}}
}

// mustRead reads a trace from a string or fails the test.
func mustRead(t testing.TB, s string) *Trace {
	t.Helper()
	tr, err := Read(strings.NewReader(s))
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return tr
}

// mustFile returns a file's content or fails the test.
func mustFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
