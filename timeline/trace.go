package timeline

import (
	"encoding/json"
	"io"
	"math"
	"sort"
	"strconv"
)

// NoBucket is Span.Bucket for a span without args.bucket (a whole round, say).
const NoBucket = -1

// NoRound is Span.Round for a span without args.round.
const NoRound = -1

// Trace is a decoded trace: the events as written, and the processes
// (ranks), lanes (stages) and counters built from them in display order.
type Trace struct {
	// DisplayTimeUnit is the file's displayTimeUnit ("ms", "ns" or "").
	DisplayTimeUnit string
	// OtherData is the file's otherData object; JSON numbers are json.Number.
	OtherData map[string]any
	// Events is every event of traceEvents, in file order.
	Events []Event
	// Processes are the ranks in display order: by process_sort_index
	// where given, then by pid.
	Processes []*Process
}

// Process is one pid of the trace; weightcast writes one per rank.
type Process struct {
	PID int64
	// Name is the process_name metadata, or "pid N" without one.
	Name string
	// Lanes are the process's threads in display order: those with a
	// thread_sort_index first (by index), then the rest by first appearance.
	Lanes []*Lane
	// Counters are the process's counter tracks ("C" events) by first appearance.
	Counters []*Counter
	// Instants are process- and global-scoped instant events.
	Instants []Instant

	sortIndex int64
	hasSort   bool
	first     int
}

// Lane is one tid of a process; weightcast writes one per pipeline stage.
type Lane struct {
	PID, TID int64
	// Name is the thread_name metadata, else the stage of its first span,
	// else "tid N".
	Name string
	// Spans are the lane's complete events (and matched B/E pairs), sorted
	// by start time, longer first on ties.
	Spans []Span
	// Instants are the thread-scoped instant events of the lane.
	Instants []Instant
	// Depth is the number of rows the lane needs so that no two of its
	// spans that overlap share a row (1 for a lane whose spans never overlap).
	Depth int

	sortIndex int64
	hasSort   bool
	first     int
}

// Span is one interval of work on a lane: a complete event ("X") or a
// matched pair of duration events ("B"/"E").
type Span struct {
	Name string
	// Stage is args.stage, else the event's cat.
	Stage string
	// Start and Dur are in microseconds, as in the file.
	Start, Dur float64
	// Bucket is args.bucket, or NoBucket.
	Bucket int
	// Round is args.round, or NoRound.
	Round int
	// Bytes is args.bytes, or 0.
	Bytes int64
	// Args are the event's args as decoded.
	Args map[string]any
	// Row is the row of the lane the span is drawn on (0 for the first),
	// so that overlapping spans of one lane never hide each other.
	Row int
	// Index is the position in traceEvents of the span's (begin) event.
	Index int
}

// End is the span's end time in microseconds.
func (s Span) End() float64 { return s.Start + s.Dur }

// Instant is an instant event ("i").
type Instant struct {
	Name  string
	TS    float64
	Scope string
	Args  map[string]any
}

// Counter is one counter track ("C" events of one pid and name).
type Counter struct {
	PID  int64
	Name string
	// Series are the names of the counter's values (args keys), sorted.
	Series []string
	// Points are the samples in time order; Values is aligned with Series,
	// a series missing from a sample keeps its previous value.
	Points []CounterPoint

	raw []map[string]float64 // samples' values until finish aligns them
}

// CounterPoint is one sample of a counter.
type CounterPoint struct {
	TS     float64
	Values []float64
}

// Read decodes a Chrome trace-event JSON file (the JSON Object Format that
// weightcast writes, or the JSON Array Format) and builds its processes,
// lanes and counters.
//
// Read rejects, with a *ValidationError naming each event, what it cannot
// draw: fields of the wrong type, a complete event without ts or dur, a
// negative dur. It is lenient where it can be: events of a phase it does not
// know are kept in Events and not drawn, unmatched "B"/"E" events are left
// out, and overlapping spans of one lane are drawn on separate rows. Use Validate for the strict check that a trace
// loads in Perfetto and chrome://tracing.
func Read(r io.Reader) (*Trace, error) {
	rt, err := decodeTrace(r)
	if err != nil {
		return nil, err
	}
	events, all := parseEvents(rt)
	var probs []Problem
	for _, p := range all {
		if !p.readable {
			probs = append(probs, p)
		}
	}
	if len(probs) > 0 {
		return nil, &ValidationError{Problems: probs}
	}
	t := &Trace{DisplayTimeUnit: rt.displayTimeUnit, OtherData: rt.otherData, Events: events}
	t.build()
	return t, nil
}

// parseEvents decodes every event of rt, collecting problems.
func parseEvents(rt *rawTrace) ([]Event, []Problem) {
	events := make([]Event, 0, len(rt.events))
	var probs []Problem
	for i, raw := range rt.events {
		ev, p := parseEvent(i, raw)
		events = append(events, ev)
		probs = append(probs, p...)
	}
	return events, probs
}

type laneKey struct{ pid, tid int64 }

type counterKey struct {
	pid  int64
	name string
}

// build derives Processes from Events.
func (t *Trace) build() {
	procs := map[int64]*Process{}
	lanes := map[laneKey]*Lane{}
	counters := map[counterKey]*Counter{}
	open := map[laneKey][]Event{} // B events waiting for their E
	proc := func(pid int64, idx int) *Process {
		p, ok := procs[pid]
		if !ok {
			p = &Process{PID: pid, first: idx}
			procs[pid] = p
		}
		return p
	}
	lane := func(pid, tid int64, idx int) *Lane {
		k := laneKey{pid, tid}
		l, ok := lanes[k]
		if !ok {
			p := proc(pid, idx)
			l = &Lane{PID: pid, TID: tid, first: idx}
			lanes[k] = l
			p.Lanes = append(p.Lanes, l)
		}
		return l
	}
	for _, ev := range t.Events {
		switch ev.Ph {
		case "M":
			switch ev.Name {
			case "process_name":
				p := proc(ev.PID, ev.Index)
				p.Name, _ = argString(ev.Args, "name")
			case "process_sort_index":
				p := proc(ev.PID, ev.Index)
				p.sortIndex, p.hasSort = argInt(ev.Args, "sort_index")
			case "thread_name":
				l := lane(ev.PID, ev.TID, ev.Index)
				l.Name, _ = argString(ev.Args, "name")
			case "thread_sort_index":
				l := lane(ev.PID, ev.TID, ev.Index)
				l.sortIndex, l.hasSort = argInt(ev.Args, "sort_index")
			}
		case "X":
			l := lane(ev.PID, ev.TID, ev.Index)
			l.Spans = append(l.Spans, spanOf(ev, ev.Dur, nil))
		case "B":
			lane(ev.PID, ev.TID, ev.Index)
			k := laneKey{ev.PID, ev.TID}
			open[k] = append(open[k], ev)
		case "E":
			k := laneKey{ev.PID, ev.TID}
			stack := open[k]
			if len(stack) == 0 {
				continue // unmatched; Validate reports it
			}
			b := stack[len(stack)-1]
			open[k] = stack[:len(stack)-1]
			if ev.TS < b.TS {
				continue
			}
			l := lane(ev.PID, ev.TID, ev.Index)
			l.Spans = append(l.Spans, spanOf(b, ev.TS-b.TS, ev.Args))
		case "i", "I":
			in := Instant{Name: ev.Name, TS: ev.TS, Scope: ev.Scope, Args: ev.Args}
			if (ev.Scope == "" || ev.Scope == "t") && ev.HasTID {
				l := lane(ev.PID, ev.TID, ev.Index)
				l.Instants = append(l.Instants, in)
			} else {
				p := proc(ev.PID, ev.Index)
				p.Instants = append(p.Instants, in)
			}
		case "C":
			name := ev.Name
			if ev.ID != "" {
				name += " " + ev.ID
			}
			k := counterKey{ev.PID, name}
			c, ok := counters[k]
			if !ok {
				c = &Counter{PID: ev.PID, Name: name}
				counters[k] = c
				p := proc(ev.PID, ev.Index)
				p.Counters = append(p.Counters, c)
			}
			c.add(ev)
		}
	}

	for _, p := range procs {
		if p.Name == "" {
			p.Name = "pid " + strconv.FormatInt(p.PID, 10)
		}
		for _, l := range p.Lanes {
			l.finish()
		}
		sort.SliceStable(p.Lanes, func(i, j int) bool {
			a, b := p.Lanes[i], p.Lanes[j]
			if a.hasSort != b.hasSort {
				return a.hasSort
			}
			if a.hasSort && a.sortIndex != b.sortIndex {
				return a.sortIndex < b.sortIndex
			}
			return a.first < b.first
		})
		for _, c := range p.Counters {
			c.finish()
		}
		sort.SliceStable(p.Instants, func(i, j int) bool { return p.Instants[i].TS < p.Instants[j].TS })
		t.Processes = append(t.Processes, p)
	}
	sort.Slice(t.Processes, func(i, j int) bool {
		a, b := t.Processes[i], t.Processes[j]
		if a.hasSort != b.hasSort {
			return a.hasSort
		}
		if a.hasSort && a.sortIndex != b.sortIndex {
			return a.sortIndex < b.sortIndex
		}
		return a.PID < b.PID
	})
}

// spanOf makes a span from a complete or begin event; endArgs (from the "E"
// event of a pair) are merged over the begin event's args.
func spanOf(ev Event, dur float64, endArgs map[string]any) Span {
	args := ev.Args
	if len(endArgs) > 0 {
		args = make(map[string]any, len(ev.Args)+len(endArgs))
		for k, v := range ev.Args {
			args[k] = v
		}
		for k, v := range endArgs {
			args[k] = v
		}
	}
	s := Span{Name: ev.Name, Stage: ev.Cat, Start: ev.TS, Dur: dur, Bucket: NoBucket, Round: NoRound, Args: args, Index: ev.Index}
	if st, ok := argString(args, "stage"); ok && st != "" {
		s.Stage = st
	}
	if b, ok := argInt(args, "bucket"); ok && b >= 0 && b <= math.MaxInt32 {
		s.Bucket = int(b)
	}
	if r, ok := argInt(args, "round"); ok && r >= 0 && r <= math.MaxInt32 {
		s.Round = int(r)
	}
	if n, ok := argInt(args, "bytes"); ok && n >= 0 {
		s.Bytes = n
	}
	return s
}

// finish sorts the lane's spans, assigns rows and fills in a missing name.
func (l *Lane) finish() {
	sort.SliceStable(l.Spans, func(i, j int) bool {
		a, b := l.Spans[i], l.Spans[j]
		if a.Start != b.Start {
			return a.Start < b.Start
		}
		if a.Dur != b.Dur {
			return a.Dur > b.Dur
		}
		return a.Index < b.Index
	})
	// Greedy interval partitioning: each span takes the first row whose
	// last span has ended. Nested spans land one row below their parent.
	var rowEnd []float64
	for i := range l.Spans {
		s := &l.Spans[i]
		row := -1
		for r, end := range rowEnd {
			if end <= s.Start+overlapSlack {
				row = r
				break
			}
		}
		if row < 0 {
			row = len(rowEnd)
			rowEnd = append(rowEnd, 0)
		}
		rowEnd[row] = s.End()
		s.Row = row
	}
	l.Depth = max(1, len(rowEnd))
	sort.SliceStable(l.Instants, func(i, j int) bool { return l.Instants[i].TS < l.Instants[j].TS })
	if l.Name == "" {
		if len(l.Spans) > 0 && l.Spans[0].Stage != "" {
			l.Name = l.Spans[0].Stage
		} else {
			l.Name = "tid " + strconv.FormatInt(l.TID, 10)
		}
	}
}

// overlapSlack is the overlap, in microseconds, below which two spans count
// as touching rather than overlapping: one nanosecond, the resolution
// Perfetto stores timestamps at.
const overlapSlack = 0.001

// add appends a sample from a "C" event.
func (c *Counter) add(ev Event) {
	vals := map[string]float64{}
	for k, v := range ev.Args {
		if n, ok := v.(json.Number); ok {
			if f, err := n.Float64(); err == nil {
				vals[k] = f
			}
		}
	}
	c.Points = append(c.Points, CounterPoint{TS: ev.TS, Values: nil})
	// Values are aligned to Series in finish; keep the raw map meanwhile.
	c.raw = append(c.raw, vals)
}

// finish sorts samples by time and aligns their values with Series.
func (c *Counter) finish() {
	set := map[string]bool{}
	for _, m := range c.raw {
		for k := range m {
			set[k] = true
		}
	}
	c.Series = sortedKeys(set)
	idx := make([]int, len(c.Points))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return c.Points[idx[a]].TS < c.Points[idx[b]].TS })
	prev := make([]float64, len(c.Series))
	pts := make([]CounterPoint, 0, len(idx))
	for _, i := range idx {
		vals := make([]float64, len(c.Series))
		for j, s := range c.Series {
			if v, ok := c.raw[i][s]; ok {
				prev[j] = v
			}
			vals[j] = prev[j]
		}
		pts = append(pts, CounterPoint{TS: c.Points[i].TS, Values: vals})
	}
	c.Points = pts
	c.raw = nil
}

// Bounds returns the earliest start and the latest end, in microseconds, of
// the trace's spans, instants and counter samples; ok is false for a trace
// with none of them.
func (t *Trace) Bounds() (start, end float64, ok bool) {
	start, end = math.Inf(1), math.Inf(-1)
	see := func(a, b float64) {
		start, end, ok = min(start, a), max(end, b), true
	}
	for _, p := range t.Processes {
		for _, l := range p.Lanes {
			for _, s := range l.Spans {
				see(s.Start, s.End())
			}
			for _, in := range l.Instants {
				see(in.TS, in.TS)
			}
		}
		for _, in := range p.Instants {
			see(in.TS, in.TS)
		}
		for _, c := range p.Counters {
			for _, pt := range c.Points {
				see(pt.TS, pt.TS)
			}
		}
	}
	if !ok {
		return 0, 0, false
	}
	return start, end, true
}

// spanBounds is Bounds over spans only: the wall time of the work.
func (t *Trace) spanBounds() (start, end float64, ok bool) {
	start, end = math.Inf(1), math.Inf(-1)
	for _, p := range t.Processes {
		for _, l := range p.Lanes {
			for _, s := range l.Spans {
				start, end, ok = min(start, s.Start), max(end, s.End()), true
			}
		}
	}
	if !ok {
		return 0, 0, false
	}
	return start, end, true
}
