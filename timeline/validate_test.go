package timeline

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestValidateAcceptsFixture(t *testing.T) {
	f, err := os.Open("testdata/pipeline.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Validate(f); err != nil {
		t.Fatalf("Validate rejected the pipeline fixture: %v", err)
	}
}

func TestValidateAccepts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		trace string
	}{
		{"nested spans", traceJSON(t, span(0, 1, "round", -1, 0, 100), span(0, 1, "pack", 0, 10, 20), span(0, 1, "pack", 1, 30, 70))},
		{"back-to-back spans", traceJSON(t, span(0, 1, "pack", 0, 0, 10), span(0, 1, "pack", 1, 10, 10))},
		{"same span times on two tids", traceJSON(t, span(0, 1, "pack", 0, 0, 10), span(0, 2, "broadcast", 0, 5, 10))},
		{"zero duration", traceJSON(t, span(0, 1, "publish", 0, 5, 0))},
		{"nested B/E", traceJSON(t,
			ev{"name": "outer", "ph": "B", "ts": 0, "pid": 0, "tid": 1},
			ev{"name": "inner", "ph": "B", "ts": 1, "pid": 0, "tid": 1},
			ev{"ph": "E", "ts": 2, "pid": 0, "tid": 1},
			ev{"name": "outer", "ph": "E", "ts": 3, "pid": 0, "tid": 1})},
		{"unknown metadata and counters", traceJSON(t,
			ev{"name": "num_cpus", "ph": "M", "pid": 0, "args": map[string]any{"number": 8}},
			ev{"name": "buffers held", "ph": "C", "ts": 0, "pid": 0, "args": map[string]any{"held": 1.5}},
			ev{"name": "mark", "ph": "i", "s": "g", "ts": 0, "pid": 0})},
		{"array format", `[{"name": "a", "ph": "X", "ts": 0, "dur": 1, "pid": 0, "tid": 0}]`},
		{"array format cut short", `[{"name": "a", "ph": "X", "ts": 0, "dur": 1, "pid": 0, "tid": 0},` + "\n"},
		{"other top-level keys", `{"traceEvents": [], "systemTraceEvents": "", "metadata": {"x": 1}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Validate(strings.NewReader(tc.trace)); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestValidateRejects(t *testing.T) {
	x := func(extra ev, drop ...string) ev {
		e := ev{"name": "bucket 0", "cat": "pack", "ph": "X", "ts": 10, "dur": 5, "pid": 0, "tid": 2}
		for k, v := range extra {
			e[k] = v
		}
		for _, k := range drop {
			delete(e, k)
		}
		return e
	}
	for _, tc := range []struct {
		name  string
		trace string
		want  []string // substrings of the error
	}{
		{"missing ts", traceJSON(t, x(nil, "ts")), []string{`event #0 (ph "X", name "bucket 0", pid 0, tid 2)`, `missing "ts"`}},
		{"ts as string", traceJSON(t, x(ev{"ts": "10"})), []string{`"ts" is a string, not a JSON number`}},
		{"ts null", traceJSON(t, x(ev{"ts": nil})), []string{`"ts" is null`}},
		{"negative dur", traceJSON(t, x(ev{"dur": -5})), []string{`"dur" is -5; a complete event needs dur >= 0`}},
		{"X without dur", traceJSON(t, x(nil, "dur")), []string{`missing "dur"; a complete event (ph "X") needs a duration`}},
		{"X without tid", traceJSON(t, x(nil, "tid")), []string{`missing "tid"`}},
		{"missing pid", traceJSON(t, x(nil, "pid")), []string{`missing "pid"`}},
		{"pid not whole", traceJSON(t, x(ev{"pid": 1.5})), []string{`"pid" is 1.5, not a whole number`}},
		{"missing name", traceJSON(t, x(nil, "name")), []string{`missing "name"`}},
		{"missing ph", traceJSON(t, x(nil, "ph")), []string{`missing "ph"`}},
		{"unknown ph", traceJSON(t, x(ev{"ph": "Q"})), []string{`unknown phase "Q"`}},
		{"event not an object", `{"traceEvents": [3]}`, []string{`event #0`, `is a number; every element of traceEvents must be an event object`}},
		{"args not an object", traceJSON(t, x(ev{"args": []int{1}})), []string{`"args" is an array; it must be a JSON object`}},
		{"unmatched E", traceJSON(t, ev{"ph": "E", "ts": 1, "pid": 0, "tid": 1}), []string{`end event without a matching begin`}},
		{"unclosed B", traceJSON(t, ev{"name": "pack", "ph": "B", "ts": 1, "pid": 0, "tid": 1}), []string{`event #0 (ph "B", name "pack", pid 0, tid 1): begin event never ended`}},
		{"B/E on different tids", traceJSON(t,
			ev{"name": "pack", "ph": "B", "ts": 1, "pid": 0, "tid": 1},
			ev{"name": "pack", "ph": "E", "ts": 2, "pid": 0, "tid": 2}), []string{`end event without a matching begin`, `begin event never ended`}},
		{"E names another B", traceJSON(t,
			ev{"name": "a", "ph": "B", "ts": 1, "pid": 0, "tid": 1},
			ev{"name": "b", "ph": "B", "ts": 2, "pid": 0, "tid": 1},
			ev{"name": "a", "ph": "E", "ts": 3, "pid": 0, "tid": 1},
			ev{"name": "b", "ph": "E", "ts": 4, "pid": 0, "tid": 1}), []string{`end event named "a" closes begin event #1 named "b"`}},
		{"E before B", traceJSON(t,
			ev{"name": "a", "ph": "B", "ts": 5, "pid": 0, "tid": 1},
			ev{"name": "a", "ph": "E", "ts": 4, "pid": 0, "tid": 1}), []string{`end event at ts 4 is earlier than its begin event #0 at ts 5`}},
		{"overlapping spans on one tid", traceJSON(t, span(0, 1, "pack", 0, 0, 10), span(0, 1, "pack", 1, 5, 10)),
			[]string{`event #1 (ph "X", name "bucket 1", pid 0, tid 1): span [5, 15] µs overlaps span #0 "bucket 0" [0, 10] µs`, "give concurrent work its own tid"}},
		{"thread_name without args.name", traceJSON(t, ev{"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": map[string]any{}}),
			[]string{`metadata "thread_name" needs a non-empty string args.name`}},
		{"thread_name without tid", traceJSON(t, ev{"name": "thread_name", "ph": "M", "pid": 0, "args": map[string]any{"name": "pack"}}),
			[]string{`metadata "thread_name" needs a "tid"`}},
		{"process_name without args", traceJSON(t, ev{"name": "process_name", "ph": "M", "pid": 0}),
			[]string{`metadata "process_name" needs a non-empty string args.name`}},
		{"sort_index not whole", traceJSON(t, ev{"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": 1, "args": map[string]any{"sort_index": "2"}}),
			[]string{`metadata "thread_sort_index" needs a whole-number args.sort_index`}},
		{"counter value not a number", traceJSON(t, ev{"name": "held", "ph": "C", "ts": 0, "pid": 0, "args": map[string]any{"held": "2"}}),
			[]string{`counter series "held" is string, not a number`}},
		{"counter without args", traceJSON(t, ev{"name": "held", "ph": "C", "ts": 0, "pid": 0}),
			[]string{`missing "args"; a counter event carries its values in args`}},
		{"instant with bad scope", traceJSON(t, ev{"name": "x", "ph": "i", "s": "z", "ts": 0, "pid": 0, "tid": 0}),
			[]string{`"s" is "z"`}},
		{"async without id", traceJSON(t, ev{"name": "x", "ph": "b", "cat": "c", "ts": 0, "pid": 0, "tid": 0}),
			[]string{`missing "id"`}},
		{"displayTimeUnit", `{"traceEvents": [], "displayTimeUnit": "s"}`, []string{`displayTimeUnit is "s"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(strings.NewReader(tc.trace))
			if err == nil {
				t.Fatalf("Validate accepted %s", tc.trace)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) == 0 {
				t.Errorf("error %v is not a *ValidationError with problems", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n  %v\nlacks\n  %s", err, w)
				}
			}
		})
	}
}

func TestValidateNotATrace(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "the trace is empty"},
		{"hello", "starts with 'h'"},
		{`{"traceEvents": [`, "not valid JSON"},
		{`{"events": []}`, `no "traceEvents" key`},
		{`{"traceEvents": {}}`, `"traceEvents" must be a JSON array of event objects, got an object`},
		{`{"traceEvents": [], "otherData": 3}`, `"otherData" must be a JSON object`},
	} {
		err := Validate(strings.NewReader(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
		if _, rerr := Read(strings.NewReader(tc.in)); rerr == nil || rerr.Error() != err.Error() {
			t.Errorf("Read(%q) = %v, want the same error as Validate", tc.in, rerr)
		}
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	var evs []ev
	for i := 0; i < 25; i++ {
		evs = append(evs, ev{"name": "x", "ph": "X", "ts": i, "pid": 0, "tid": 0})
	}
	err := Validate(strings.NewReader(traceJSON(t, evs...)))
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 25 {
		t.Fatalf("got %v, want 25 problems", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "timeline: invalid trace, 25 problems:") || !strings.Contains(msg, "... and 5 more") {
		t.Errorf("error text does not summarize 25 problems:\n%s", msg)
	}
	if ve.Problems[24].Index != 24 {
		t.Errorf("problems are not in event order: last is #%d", ve.Problems[24].Index)
	}
}
