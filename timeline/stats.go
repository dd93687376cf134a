package timeline

import (
	"math"
	"sort"
	"time"
)

// StageStats sums up one lane (one stage of one rank) of a trace.
type StageStats struct {
	// Rank is the lane's pid; Process is the rank's process_name.
	Rank    int64
	Process string
	// Stage is the lane's name (thread_name); TID its tid.
	Stage string
	TID   int64
	// Items is the number of spans on the lane.
	Items int
	// Busy is the time at least one span of the lane was running (the
	// union of its spans, so nested or overlapping spans count once).
	Busy time.Duration
	// Wall is the whole trace's wall time: from the first span's start to
	// the last span's end over every rank, the same for every row so that
	// utilizations compare across ranks.
	Wall time.Duration
	// Bytes is the sum of args.bytes over the lane's spans.
	Bytes int64
}

// Utilization is Busy as a fraction of Wall (0 when Wall is 0).
func (s StageStats) Utilization() float64 {
	if s.Wall <= 0 {
		return 0
	}
	return float64(s.Busy) / float64(s.Wall)
}

// Throughput is Bytes per second of Busy time (0 when either is 0).
func (s StageStats) Throughput() float64 {
	if s.Busy <= 0 || s.Bytes <= 0 {
		return 0
	}
	return float64(s.Bytes) / s.Busy.Seconds()
}

// Utilization returns one StageStats per lane of t, in display order (ranks
// in order, each rank's lanes in order). Lanes with no spans are included
// with zero busy time.
func Utilization(t *Trace) []StageStats {
	var wall time.Duration
	if start, end, ok := t.spanBounds(); ok {
		wall = micros(end - start)
	}
	var out []StageStats
	for _, p := range t.Processes {
		for _, l := range p.Lanes {
			st := StageStats{Rank: p.PID, Process: p.Name, Stage: l.Name, TID: l.TID, Items: len(l.Spans), Wall: wall}
			for _, s := range l.Spans {
				st.Bytes += s.Bytes
			}
			st.Busy = micros(busy(l.Spans))
			out = append(out, st)
		}
	}
	return out
}

// busy is the length in microseconds of the union of the spans.
func busy(spans []Span) float64 {
	iv := make([][2]float64, 0, len(spans))
	for _, s := range spans {
		iv = append(iv, [2]float64{s.Start, s.End()})
	}
	sort.Slice(iv, func(i, j int) bool { return iv[i][0] < iv[j][0] })
	total := 0.0
	curStart, curEnd := math.Inf(-1), math.Inf(-1)
	for _, v := range iv {
		if v[0] > curEnd {
			if curEnd > curStart {
				total += curEnd - curStart
			}
			curStart, curEnd = v[0], v[1]
			continue
		}
		curEnd = max(curEnd, v[1])
	}
	if curEnd > curStart {
		total += curEnd - curStart
	}
	return total
}

// micros converts microseconds to a Duration, rounded to the nanosecond.
func micros(us float64) time.Duration {
	return time.Duration(math.Round(us * 1e3))
}
