package timeline

import (
	"fmt"
	"io"
	"sort"
	"strconv"
)

// Validate checks that r holds a trace that Perfetto and chrome://tracing
// load and draw as written. It returns nil, an error for a file that is not
// a trace at all, or a *ValidationError listing every problem, each naming
// the event's index, phase, name, pid and tid.
//
// Checked per event (see doc.go for the format's rules and sources):
//   - the event is an object with a known one-letter "ph";
//   - "pid" is present and a whole number; "ts" is present and a number
//     (metadata events excepted); "name" is present (end events excepted);
//     "cat" is a string and "args" an object where present;
//   - "X": "tid" present, "dur" present and >= 0;
//   - "B"/"E": "tid" present;
//   - "i": "s" is "g", "p" or "t", and thread-scoped instants have a "tid";
//   - "C": args holds at least one series, every value a number;
//   - "M": process_name and thread_name carry a string args.name,
//     process_sort_index and thread_sort_index a whole args.sort_index,
//     process_labels a string args.labels; thread metadata has a "tid";
//   - async and flow events carry an "id".
//
// Checked across events, per pid and tid:
//   - every "E" closes an open "B" (the most recent one), not earlier than
//     it began, and with the same name where the "E" names one; no "B"
//     is left open at the end of the trace;
//   - spans ("X" and matched "B"/"E") nest perfectly: two spans of one
//     thread either do not overlap or one contains the other. Perfetto
//     does not draw partly overlapping spans of one thread correctly.
//
// Validate also checks that displayTimeUnit, where present, is "ms" or "ns".
func Validate(r io.Reader) error {
	rt, err := decodeTrace(r)
	if err != nil {
		return err
	}
	var probs []Problem
	if rt.hasUnit && rt.displayTimeUnit != "ms" && rt.displayTimeUnit != "ns" {
		probs = append(probs, Problem{Index: -1, Msg: fmt.Sprintf("displayTimeUnit is %q; the format allows \"ms\" or \"ns\"", rt.displayTimeUnit)})
	}
	events, p := parseEvents(rt)
	probs = append(probs, p...)
	probs = append(probs, checkThreads(events)...)
	if len(probs) > 0 {
		sort.SliceStable(probs, func(i, j int) bool { return probs[i].Index < probs[j].Index })
		return &ValidationError{Problems: probs}
	}
	return nil
}

// interval is a span of one thread for the nesting check.
type interval struct {
	start, end float64
	ev         Event
}

// checkThreads pairs B/E events and checks that spans nest, per pid and tid.
// Events with problems of their own (no pid, no tid, no ts) are skipped here.
func checkThreads(events []Event) []Problem {
	var probs []Problem
	prob := func(ev Event, format string, a ...any) {
		probs = append(probs, Problem{
			Index: ev.Index, Ph: ev.Ph, Name: ev.Name,
			PID: strconv.FormatInt(ev.PID, 10), TID: strconv.FormatInt(ev.TID, 10),
			Msg: fmt.Sprintf(format, a...),
		})
	}
	open := map[laneKey][]Event{}
	spans := map[laneKey][]interval{}
	var order []laneKey
	seen := map[laneKey]bool{}
	note := func(k laneKey) {
		if !seen[k] {
			seen[k] = true
			order = append(order, k)
		}
	}
	for _, ev := range events {
		if !ev.HasPID || !ev.HasTID || !ev.HasTS {
			continue
		}
		k := laneKey{ev.PID, ev.TID}
		switch ev.Ph {
		case "X":
			if !ev.HasDur || ev.Dur < 0 {
				continue
			}
			note(k)
			spans[k] = append(spans[k], interval{ev.TS, ev.TS + ev.Dur, ev})
		case "B":
			note(k)
			open[k] = append(open[k], ev)
		case "E":
			note(k)
			stack := open[k]
			if len(stack) == 0 {
				prob(ev, "end event without a matching begin (\"B\") on this pid and tid")
				continue
			}
			b := stack[len(stack)-1]
			open[k] = stack[:len(stack)-1]
			if ev.Name != "" && ev.Name != b.Name {
				prob(ev, "end event named %q closes begin event #%d named %q; B/E pairs must nest (the E closes the most recent open B)", ev.Name, b.Index, b.Name)
				continue
			}
			if ev.TS < b.TS {
				prob(ev, "end event at ts %s is earlier than its begin event #%d at ts %s", fmtNum(ev.TS), b.Index, fmtNum(b.TS))
				continue
			}
			spans[k] = append(spans[k], interval{b.TS, ev.TS, b})
		}
	}
	for _, k := range order {
		for _, b := range open[k] {
			prob(b, "begin event never ended: no matching \"E\" on this pid and tid")
		}
		checkNesting(spans[k], prob)
	}
	return probs
}

// checkNesting reports spans of one thread that overlap without nesting.
func checkNesting(iv []interval, prob func(Event, string, ...any)) {
	sort.SliceStable(iv, func(i, j int) bool {
		if iv[i].start != iv[j].start {
			return iv[i].start < iv[j].start
		}
		return iv[i].end > iv[j].end
	})
	var stack []interval
	for _, s := range iv {
		for len(stack) > 0 && stack[len(stack)-1].end <= s.start+overlapSlack {
			stack = stack[:len(stack)-1]
		}
		if n := len(stack); n > 0 && s.end > stack[n-1].end+overlapSlack {
			top := stack[n-1]
			prob(s.ev, "span [%s, %s] µs overlaps span #%d %q [%s, %s] µs on the same pid and tid without nesting inside it; Perfetto draws only perfectly nested spans of one thread: give concurrent work its own tid",
				fmtNum(s.start), fmtNum(s.end), top.ev.Index, top.ev.Name, fmtNum(top.start), fmtNum(top.end))
			continue
		}
		stack = append(stack, s)
	}
}
