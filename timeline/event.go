package timeline

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Event is one entry of a trace's traceEvents array, with the fields of the
// Trace Event Format decoded. Fields the format leaves optional carry a Has*
// flag so that an absent field and a zero value stay distinct.
type Event struct {
	// Index is the event's position in traceEvents, counted from 0.
	Index int
	// Ph is the phase: "X" complete, "B"/"E" begin/end, "i" instant,
	// "C" counter, "M" metadata, and the others the format defines.
	Ph string
	// Name is the event name ("bucket 3", "process_name", ...).
	Name string
	// Cat is the category; weightcast writes the stage name here.
	Cat string
	// TS is the timestamp in microseconds (valid when HasTS).
	TS    float64
	HasTS bool
	// Dur is the duration of a complete event in microseconds (valid when HasDur).
	Dur    float64
	HasDur bool
	// PID is the process id; weightcast writes the rank number (valid when HasPID).
	PID    int64
	HasPID bool
	// TID is the thread id; weightcast writes the stage lane number (valid when HasTID).
	TID    int64
	HasTID bool
	// Scope is the "s" field of instant events: "g", "p", "t" or "".
	Scope string
	// ID is the "id" field (async, flow and counter events), as written.
	ID string
	// Args holds the event's args object; JSON numbers are json.Number.
	Args map[string]any
}

// phases is every phase letter the Trace Event Format defines.
var phases = map[string]string{
	"B": "duration begin", "E": "duration end", "X": "complete",
	"i": "instant", "I": "instant (legacy)", "C": "counter",
	"b": "async nestable begin", "n": "async nestable instant", "e": "async nestable end",
	"S": "async begin (legacy)", "T": "async step into (legacy)", "p": "async step past (legacy)", "F": "async end (legacy)",
	"s": "flow start", "t": "flow step", "f": "flow end",
	"P": "sample", "N": "object created", "O": "object snapshot", "D": "object destroyed",
	"M": "metadata", "V": "memory dump (global)", "v": "memory dump (process)",
	"R": "mark", "c": "clock sync", "(": "context enter", ")": "context leave",
}

// Problem is one defect found in a trace. Index is the event's position in
// traceEvents, or -1 for a defect of the whole file.
type Problem struct {
	Index int
	Ph    string
	Name  string
	PID   string // "" when the event has no pid
	TID   string // "" when the event has no tid
	Msg   string

	readable bool // Read can skip the event and go on (an unknown phase)
}

// String says where the problem is and what it is.
func (p Problem) String() string {
	if p.Index < 0 {
		return p.Msg
	}
	var b strings.Builder
	fmt.Fprintf(&b, "event #%d (", p.Index)
	parts := []string{}
	if p.Ph != "" {
		parts = append(parts, fmt.Sprintf("ph %q", p.Ph))
	}
	if p.Name != "" {
		parts = append(parts, fmt.Sprintf("name %q", p.Name))
	}
	if p.PID != "" {
		parts = append(parts, "pid "+p.PID)
	}
	if p.TID != "" {
		parts = append(parts, "tid "+p.TID)
	}
	if len(parts) == 0 {
		parts = append(parts, "no ph, no name")
	}
	b.WriteString(strings.Join(parts, ", "))
	b.WriteString("): ")
	b.WriteString(p.Msg)
	return b.String()
}

// ValidationError lists every problem found in a trace. Read and Validate
// return it (use errors.As) so that callers can inspect single problems.
type ValidationError struct {
	Problems []Problem
}

// maxListed is how many problems Error spells out.
const maxListed = 20

// Error lists the problems found.
func (e *ValidationError) Error() string {
	var b strings.Builder
	n := len(e.Problems)
	if n == 1 {
		b.WriteString("timeline: invalid trace: ")
		b.WriteString(e.Problems[0].String())
		return b.String()
	}
	fmt.Fprintf(&b, "timeline: invalid trace, %d problems:", n)
	for i, p := range e.Problems {
		if i == maxListed {
			fmt.Fprintf(&b, "\n  ... and %d more", n-maxListed)
			break
		}
		b.WriteString("\n  ")
		b.WriteString(p.String())
	}
	return b.String()
}

// rawTrace is a trace file split into its parts, not yet interpreted.
type rawTrace struct {
	displayTimeUnit string
	hasUnit         bool
	otherData       map[string]any
	events          []json.RawMessage
}

// decodeTrace reads the JSON Object Format ({"traceEvents": [...], ...}) or
// the JSON Array Format ([...]). A trailing "]" may be missing from the array
// format, as the format allows, but not from the object format.
func decodeTrace(r io.Reader) (*rawTrace, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("timeline: read trace: %w", err)
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, errors.New("timeline: the trace is empty; expected a JSON object {\"traceEvents\": [...]} or a JSON array of events")
	}
	rt := &rawTrace{}
	switch data[0] {
	case '[':
		if data[len(data)-1] != ']' {
			// The array format allows the closing bracket to be missing
			// (a process killed mid-write); drop a trailing comma.
			data = append(bytes.TrimRight(data, ", \t\r\n"), ']')
		}
		if err := json.Unmarshal(data, &rt.events); err != nil {
			return nil, fmt.Errorf("timeline: the trace is not a valid JSON array of events: %w", err)
		}
	case '{':
		var top map[string]json.RawMessage
		if err := json.Unmarshal(data, &top); err != nil {
			return nil, fmt.Errorf("timeline: the trace is not valid JSON: %w", err)
		}
		raw, ok := top["traceEvents"]
		if !ok {
			return nil, errors.New("timeline: the trace object has no \"traceEvents\" key; the JSON Object Format needs {\"traceEvents\": [...]}")
		}
		if err := json.Unmarshal(raw, &rt.events); err != nil || rt.events == nil {
			return nil, fmt.Errorf("timeline: \"traceEvents\" must be a JSON array of event objects, got %s", describeJSON(raw))
		}
		if u, ok := top["displayTimeUnit"]; ok {
			rt.hasUnit = true
			if err := json.Unmarshal(u, &rt.displayTimeUnit); err != nil {
				return nil, fmt.Errorf("timeline: \"displayTimeUnit\" must be the string \"ms\" or \"ns\", got %s", describeJSON(u))
			}
		}
		if od, ok := top["otherData"]; ok {
			d := json.NewDecoder(bytes.NewReader(od))
			d.UseNumber()
			if err := d.Decode(&rt.otherData); err != nil {
				return nil, fmt.Errorf("timeline: \"otherData\" must be a JSON object, got %s", describeJSON(od))
			}
		}
	default:
		return nil, fmt.Errorf("timeline: the trace starts with %q; expected a JSON object {\"traceEvents\": [...]} or a JSON array of events", data[0])
	}
	return rt, nil
}

// describeJSON names the JSON type of raw for error messages.
func describeJSON(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	default:
		return "a number"
	}
}

// number decodes a JSON number. It rejects strings, null and the rest with a
// message naming what was found.
func number(raw json.RawMessage) (float64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || describeJSON(raw) != "a number" {
		return 0, fmt.Errorf("is %s, not a JSON number", describeJSON(raw))
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("is %s, not a finite number", raw)
	}
	return f, nil
}

// integer decodes a JSON number that must be a whole number.
func integer(raw json.RawMessage) (int64, error) {
	f, err := number(raw)
	if err != nil {
		return 0, err
	}
	if f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, fmt.Errorf("is %s, not a whole number", bytes.TrimSpace(raw))
	}
	return int64(f), nil
}

// argInt returns args[key] as an integer when it is a whole JSON number.
func argInt(args map[string]any, key string) (int64, bool) {
	n, ok := args[key].(json.Number)
	if !ok {
		return 0, false
	}
	if i, err := n.Int64(); err == nil {
		return i, true
	}
	f, err := n.Float64()
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int64(f), true
}

// argString returns args[key] when it is a string.
func argString(args map[string]any, key string) (string, bool) {
	s, ok := args[key].(string)
	return s, ok
}

// parseEvent decodes one element of traceEvents and checks the fields that
// the Trace Event Format requires for its phase (see doc.go). It returns the
// event as far as it could be decoded, and every problem found.
func parseEvent(i int, raw json.RawMessage) (Event, []Problem) {
	ev := Event{Index: i}
	var probs []Problem
	add := func(format string, a ...any) {
		p := Problem{Index: i, Ph: ev.Ph, Name: ev.Name, Msg: fmt.Sprintf(format, a...)}
		if ev.HasPID {
			p.PID = strconv.FormatInt(ev.PID, 10)
		}
		if ev.HasTID {
			p.TID = strconv.FormatInt(ev.TID, 10)
		}
		probs = append(probs, p)
	}
	var obj rawObject
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		add("is %s; every element of traceEvents must be an event object", describeJSON(raw))
		return ev, probs
	}

	// Decode the identifying fields first so that later messages name them.
	phOK := false
	if r, ok := obj["ph"]; ok {
		if err := json.Unmarshal(r, &ev.Ph); err != nil {
			add("\"ph\" is %s; it must be a one-letter string such as \"X\"", describeJSON(r))
		} else {
			phOK = true
		}
	}
	hasName := false
	if r, ok := obj["name"]; ok {
		if err := json.Unmarshal(r, &ev.Name); err != nil {
			add("\"name\" is %s; it must be a string", describeJSON(r))
		} else {
			hasName = true
		}
	}
	if r, ok := obj["cat"]; ok {
		if err := json.Unmarshal(r, &ev.Cat); err != nil {
			add("\"cat\" is %s; it must be a string (comma-separated categories)", describeJSON(r))
		}
	}
	hasPIDField, hasTIDField := false, false
	if r, ok := obj["pid"]; ok {
		hasPIDField = true
		if v, err := integer(r); err != nil {
			add("\"pid\" %v; it must be a whole number (weightcast writes the rank)", err)
		} else {
			ev.PID, ev.HasPID = v, true
		}
	}
	if r, ok := obj["tid"]; ok {
		hasTIDField = true
		if v, err := integer(r); err != nil {
			add("\"tid\" %v; it must be a whole number (weightcast writes the stage lane)", err)
		} else {
			ev.TID, ev.HasTID = v, true
		}
	}
	if r, ok := obj["ts"]; ok {
		if v, err := number(r); err != nil {
			add("\"ts\" %v; it must be a number of microseconds", err)
		} else {
			ev.TS, ev.HasTS = v, true
		}
	}
	hasDurField := false
	if r, ok := obj["dur"]; ok {
		hasDurField = true
		if v, err := number(r); err != nil {
			add("\"dur\" %v; it must be a number of microseconds", err)
		} else {
			ev.Dur, ev.HasDur = v, true
		}
	}
	hasArgsField := false
	if r, ok := obj["args"]; ok {
		hasArgsField = true
		d := json.NewDecoder(bytes.NewReader(r))
		d.UseNumber()
		if err := d.Decode(&ev.Args); err != nil || ev.Args == nil {
			ev.Args = nil
			add("\"args\" is %s; it must be a JSON object", describeJSON(r))
		}
	}
	if r, ok := obj["id"]; ok {
		var str string
		if json.Unmarshal(r, &str) == nil {
			ev.ID = str
		} else if _, err := number(r); err == nil {
			ev.ID = string(bytes.TrimSpace(r))
		} else {
			add("\"id\" is %s; it must be a string or a number", describeJSON(r))
		}
	}
	if r, ok := obj["s"]; ok {
		if err := json.Unmarshal(r, &ev.Scope); err != nil {
			add("\"s\" is %s; it must be \"g\", \"p\" or \"t\"", describeJSON(r))
		}
	}

	if _, ok := obj["ph"]; !ok {
		add("missing \"ph\"; every event needs a phase such as \"X\" (complete) or \"M\" (metadata)")
		return ev, probs
	}
	if !phOK {
		return ev, probs
	}
	if _, known := phases[ev.Ph]; !known {
		add("unknown phase %q; the Trace Event Format defines %s", ev.Ph, knownPhases())
		probs[len(probs)-1].readable = true
		return ev, probs
	}

	// Fields every phase needs.
	if !hasPIDField {
		add("missing \"pid\"; every event needs a process id (weightcast writes the rank)")
	}
	if ev.Ph != "M" && !obj.has("ts") {
		add("missing \"ts\"; every event but metadata needs a timestamp in microseconds (Perfetto drops events without one)")
	}
	if ev.Ph != "E" && !obj.has("name") {
		add("missing \"name\"")
	} else if ev.Ph != "E" && hasName && ev.Name == "" && ev.Ph != "M" {
		add("\"name\" is empty; give the event a name people can read")
	}

	switch ev.Ph {
	case "X":
		if !hasTIDField {
			add("missing \"tid\"; a complete event is drawn on the thread (lane) it names")
		}
		if !hasDurField {
			add("missing \"dur\"; a complete event (ph \"X\") needs a duration in microseconds")
		} else if ev.HasDur && ev.Dur < 0 {
			add("\"dur\" is %s; a complete event needs dur >= 0", fmtNum(ev.Dur))
		}
	case "B", "E":
		if !hasTIDField {
			add("missing \"tid\"; duration events pair by pid and tid")
		}
	case "i", "I":
		switch ev.Scope {
		case "", "t":
			if !hasTIDField {
				add("missing \"tid\"; a thread-scoped instant event needs the thread it belongs to")
			}
		case "g", "p":
		default:
			add("\"s\" is %q; an instant event's scope must be \"g\", \"p\" or \"t\"", ev.Scope)
		}
	case "C":
		if !hasArgsField {
			add("missing \"args\"; a counter event carries its values in args, e.g. {\"value\": 2}")
		} else if ev.Args != nil {
			if len(ev.Args) == 0 {
				add("\"args\" is empty; a counter event needs at least one numeric series")
			}
			for _, k := range sortedKeys(ev.Args) {
				if _, ok := ev.Args[k].(json.Number); !ok {
					add("counter series %q is %T, not a number", k, ev.Args[k])
				}
			}
		}
	case "M":
		switch ev.Name {
		case "process_name", "thread_name":
			if s, ok := argString(ev.Args, "name"); !ok || s == "" {
				add("metadata %q needs a non-empty string args.name", ev.Name)
			}
		case "process_sort_index", "thread_sort_index":
			if _, ok := argInt(ev.Args, "sort_index"); !ok {
				add("metadata %q needs a whole-number args.sort_index", ev.Name)
			}
		case "process_labels":
			if _, ok := argString(ev.Args, "labels"); !ok {
				add("metadata \"process_labels\" needs a string args.labels")
			}
		}
		if strings.HasPrefix(ev.Name, "thread_") && !hasTIDField {
			add("metadata %q needs a \"tid\"", ev.Name)
		}
	case "b", "e", "n", "S", "T", "p", "F", "s", "t", "f":
		if !obj.has("id") && !obj.has("id2") {
			add("missing \"id\"; %s events are matched by id", phases[ev.Ph])
		}
	}
	return ev, probs
}

// rawObject is an event object with its values not yet decoded.
type rawObject map[string]json.RawMessage

// has reports whether the object has the key.
func (o rawObject) has(key string) bool { _, ok := o[key]; return ok }

func knownPhases() string {
	keys := make([]string, 0, len(phases))
	for k := range phases {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, " ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// fmtNum formats a number the shortest way that reads it back exactly.
func fmtNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
