package timeline

import (
	"math"
	"testing"
	"time"
)

func TestUtilization(t *testing.T) {
	tr := mustRead(t, traceJSON(t,
		processName(0, "rank 0 (sender)"), threadName(0, 1, "pack"), threadName(0, 2, "broadcast"), threadName(0, 3, "idle"),
		span(0, 1, "pack", 0, 0, 10),
		span(0, 1, "pack", 1, 10, 10),
		span(0, 2, "broadcast", 0, 10, 30), // wall is [0, 40] µs
		span(0, 2, "broadcast", 1, 20, 5),  // nested: busy counts it once
		processName(1, "rank 1"),
		span(1, 1, "load", -1, 35, 5),
	))
	st := Utilization(tr)
	if len(st) != 4 {
		t.Fatalf("got %d rows, want 4: %+v", len(st), st)
	}
	want := []struct {
		rank          int64
		stage         string
		items         int
		busy          time.Duration
		bytes         int64
		util          float64
		throughputBPS float64
	}{
		{0, "pack", 2, 20 * time.Microsecond, 2 << 20, 0.5, float64(2<<20) / 20e-6},
		{0, "broadcast", 2, 30 * time.Microsecond, 2 << 20, 0.75, float64(2<<20) / 30e-6},
		{0, "idle", 0, 0, 0, 0, 0},
		{1, "load", 1, 5 * time.Microsecond, 0, 0.125, 0},
	}
	for i, w := range want {
		s := st[i]
		if s.Rank != w.rank || s.Stage != w.stage || s.Items != w.items || s.Busy != w.busy || s.Bytes != w.bytes {
			t.Errorf("row %d = %+v, want %+v", i, s, w)
		}
		if s.Wall != 40*time.Microsecond {
			t.Errorf("row %d wall %v, want 40µs for every row", i, s.Wall)
		}
		if math.Abs(s.Utilization()-w.util) > 1e-9 {
			t.Errorf("row %d utilization %v, want %v", i, s.Utilization(), w.util)
		}
		if math.Abs(s.Throughput()-w.throughputBPS) > 1e-3 {
			t.Errorf("row %d throughput %v, want %v", i, s.Throughput(), w.throughputBPS)
		}
	}
	if st[0].Process != "rank 0 (sender)" || st[3].Process != "rank 1" {
		t.Errorf("process names %q %q", st[0].Process, st[3].Process)
	}
}

func TestBusyUnion(t *testing.T) {
	for _, tc := range []struct {
		spans [][2]float64
		want  float64
	}{
		{nil, 0},
		{[][2]float64{{0, 10}}, 10},
		{[][2]float64{{0, 10}, {5, 10}}, 15},
		{[][2]float64{{20, 5}, {0, 10}}, 15},
		{[][2]float64{{0, 10}, {10, 10}}, 20},
		{[][2]float64{{0, 100}, {10, 10}, {50, 60}}, 110},
	} {
		var spans []Span
		for _, s := range tc.spans {
			spans = append(spans, Span{Start: s[0], Dur: s[1]})
		}
		if got := busy(spans); got != tc.want {
			t.Errorf("busy(%v) = %v, want %v", tc.spans, got, tc.want)
		}
	}
}
