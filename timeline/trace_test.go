package timeline

import (
	"errors"
	"strings"
	"testing"
)

func laneNames(p *Process) string {
	var s []string
	for _, l := range p.Lanes {
		s = append(s, l.Name)
	}
	return strings.Join(s, ",")
}

func TestReadFixture(t *testing.T) {
	tr := mustRead(t, mustFile(t, "testdata/pipeline.json"))
	if tr.DisplayTimeUnit != "ms" || tr.OtherData["transport"] != "tcp" {
		t.Errorf("displayTimeUnit %q, otherData %v", tr.DisplayTimeUnit, tr.OtherData)
	}
	if len(tr.Processes) != 3 {
		t.Fatalf("got %d processes, want 3", len(tr.Processes))
	}
	if got := laneNames(tr.Processes[0]); got != "round,iterate,pack,publish,broadcast" {
		t.Errorf("sender lanes %s", got)
	}
	if got := laneNames(tr.Processes[2]); got != "subscribe,broadcast,unpack,load" {
		t.Errorf("receiver lanes %s", got)
	}
	pack := tr.Processes[0].Lanes[2]
	if len(pack.Spans) != 6 || pack.Depth != 1 {
		t.Fatalf("pack lane has %d spans on %d rows, want 6 on 1", len(pack.Spans), pack.Depth)
	}
	s := pack.Spans[3]
	if s.Name != "bucket 3" || s.Stage != "pack" || s.Bucket != 3 || s.Round != 1 || s.Bytes != 256<<20 {
		t.Errorf("pack span 3 decoded as %+v", s)
	}
	round := tr.Processes[0].Lanes[0].Spans[0]
	if round.Bucket != NoBucket || round.Round != 1 {
		t.Errorf("round span has bucket %d round %d, want NoBucket and 1", round.Bucket, round.Round)
	}
	if c := tr.Processes[1].Counters; len(c) != 1 || c[0].Name != "buffers held" || len(c[0].Series) != 1 {
		t.Errorf("receiver counters %+v", c)
	}
	if in := tr.Processes[0].Lanes[3].Instants; len(in) != 1 || in[0].Name != "is_last" {
		t.Errorf("publish lane instants %+v", in)
	}
}

func TestReadLaneOrder(t *testing.T) {
	sortIdx := func(pid, tid, i int) ev {
		return ev{"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": map[string]any{"sort_index": i}}
	}
	tr := mustRead(t, traceJSON(t,
		// pid 3 first in the file; ranks still come out by pid.
		span(3, 1, "load", 0, 0, 1),
		span(1, 9, "zeta", 0, 0, 1), // no sort index, first seen
		span(1, 7, "custom", 0, 0, 1),
		sortIdx(1, 5, 2), threadName(1, 5, "broadcast"),
		sortIdx(1, 4, 1), threadName(1, 4, "pack"),
		ev{"name": "x", "ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 8}, // no name, stage or cat
		ev{"name": "process_sort_index", "ph": "M", "pid": 3, "args": map[string]any{"sort_index": -1}},
	))
	if len(tr.Processes) != 2 || tr.Processes[0].PID != 3 || tr.Processes[1].PID != 1 {
		t.Fatalf("process order %v, want pid 3 (process_sort_index -1) before pid 1", tr.Processes)
	}
	if got := tr.Processes[0].Name; got != "pid 3" {
		t.Errorf("unnamed process is %q, want %q", got, "pid 3")
	}
	if got := laneNames(tr.Processes[1]); got != "pack,broadcast,zeta,custom,tid 8" {
		t.Errorf("lane order %s, want sorted lanes first, then by first appearance", got)
	}
}

func TestReadBeginEndAndRows(t *testing.T) {
	tr, err := Read(strings.NewReader(traceJSON(t,
		ev{"name": "pack", "ph": "B", "ts": 0, "pid": 0, "tid": 1, "args": map[string]any{"bucket": 0}},
		ev{"ph": "E", "ts": 10, "pid": 0, "tid": 1, "args": map[string]any{"bytes": 100}},
		ev{"ph": "E", "ts": 11, "pid": 0, "tid": 1}, // unmatched: left out
		span(0, 1, "pack", 1, 5, 10),                // overlaps: second row
		span(0, 1, "pack", 2, 20, 1),
	)))
	if err != nil {
		t.Fatalf("Read should tolerate an unmatched E and overlapping spans: %v", err)
	}
	l := tr.Processes[0].Lanes[0]
	if len(l.Spans) != 3 || l.Depth != 2 {
		t.Fatalf("lane has %d spans on %d rows, want 3 on 2", len(l.Spans), l.Depth)
	}
	be := l.Spans[0]
	if be.Name != "pack" || be.Dur != 10 || be.Bucket != 0 || be.Bytes != 100 {
		t.Errorf("B/E pair became %+v", be)
	}
	if rows := []int{l.Spans[0].Row, l.Spans[1].Row, l.Spans[2].Row}; rows[0] != 0 || rows[1] != 1 || rows[2] != 0 {
		t.Errorf("rows %v, want [0 1 0]", rows)
	}
}

func TestReadCounters(t *testing.T) {
	tr := mustRead(t, traceJSON(t,
		ev{"name": "mem", "ph": "C", "ts": 20, "pid": 0, "args": map[string]any{"b": 5}},
		ev{"name": "mem", "ph": "C", "ts": 10, "pid": 0, "args": map[string]any{"a": 1, "b": 2}},
		ev{"name": "mem", "ph": "C", "ts": 30, "pid": 0, "args": map[string]any{"a": 3}},
		ev{"name": "mem", "ph": "C", "ts": 30, "pid": 0, "id": 7, "args": map[string]any{"a": 9}},
	))
	cs := tr.Processes[0].Counters
	if len(cs) != 2 || cs[0].Name != "mem" || cs[1].Name != "mem 7" {
		t.Fatalf("counters %+v, want mem and mem 7 (name plus id)", cs)
	}
	c := cs[0]
	if strings.Join(c.Series, ",") != "a,b" {
		t.Errorf("series %v", c.Series)
	}
	want := [][3]float64{{10, 1, 2}, {20, 1, 5}, {30, 3, 5}}
	for i, w := range want {
		p := c.Points[i]
		if p.TS != w[0] || p.Values[0] != w[1] || p.Values[1] != w[2] {
			t.Errorf("point %d = %v %v, want %v (sorted by time, missing series carried forward)", i, p.TS, p.Values, w)
		}
	}
}

func TestReadRejects(t *testing.T) {
	_, err := Read(strings.NewReader(traceJSON(t, span(0, 1, "pack", 0, 0, -1))))
	var ve *ValidationError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "dur >= 0") {
		t.Errorf("Read of a negative dur: %v", err)
	}
}

func TestBounds(t *testing.T) {
	tr := mustRead(t, traceJSON(t,
		span(0, 1, "pack", 0, 100, 50),
		ev{"name": "c", "ph": "C", "ts": 90, "pid": 0, "args": map[string]any{"v": 1}},
		ev{"name": "i", "ph": "i", "s": "p", "ts": 200, "pid": 0},
	))
	s, e, ok := tr.Bounds()
	if !ok || s != 90 || e != 200 {
		t.Errorf("Bounds = %v %v %v, want 90 200 true", s, e, ok)
	}
	if _, _, ok := (&Trace{}).Bounds(); ok {
		t.Error("Bounds of an empty trace is ok")
	}
}

func TestReadSkipsUnknownPhases(t *testing.T) {
	trace := traceJSON(t, span(0, 1, "pack", 0, 0, 10), ev{"name": "odd", "ph": "Q", "ts": 0, "pid": 0, "tid": 1})
	tr, err := Read(strings.NewReader(trace))
	if err != nil {
		t.Fatalf("Read should skip an event of an unknown phase: %v", err)
	}
	if len(tr.Events) != 2 || len(tr.Processes[0].Lanes[0].Spans) != 1 {
		t.Errorf("got %d events and %d spans, want 2 and 1", len(tr.Events), len(tr.Processes[0].Lanes[0].Spans))
	}
	if err := Validate(strings.NewReader(trace)); err == nil || !strings.Contains(err.Error(), `unknown phase "Q"`) {
		t.Errorf("Validate: %v, want it to reject the unknown phase", err)
	}
}
