package pipeline

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"
)

// Event is one Chrome trace event (the Trace Event Format that Perfetto and
// chrome://tracing open). Ts and Dur are in microseconds.
type Event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  float64        `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// Tracer collects the spans of one or more pipelines. It is safe for
// concurrent use. Timestamps count from its epoch, so tracers of several
// processes that share an epoch produce traces that merge on one time axis.
type Tracer struct {
	epoch time.Time
	mu    sync.Mutex
	meta  []Event
	evs   []Event
	named map[[2]int]bool
}

// NewTracer returns a Tracer whose timestamps count from epoch (use
// time.Now() for a single process; share one epoch across processes).
func NewTracer(epoch time.Time) *Tracer {
	return &Tracer{epoch: epoch, named: map[[2]int]bool{}}
}

// Epoch is the time that timestamps count from.
func (t *Tracer) Epoch() time.Time { return t.epoch }

func (t *Tracer) micros(at time.Time) float64 {
	return float64(at.Sub(t.epoch).Nanoseconds()) / 1e3
}

func (t *Tracer) add(ev Event) {
	t.mu.Lock()
	t.evs = append(t.evs, ev)
	t.mu.Unlock()
}

// NameProcess labels process id pid ("rank 0 (sender)").
func (t *Tracer) NameProcess(pid int, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.named[[2]int{pid, -1}] {
		return
	}
	t.named[[2]int{pid, -1}] = true
	t.meta = append(t.meta,
		Event{Name: "process_name", Ph: "M", Pid: pid, Args: map[string]any{"name": name}},
		Event{Name: "process_sort_index", Ph: "M", Pid: pid, Args: map[string]any{"sort_index": pid}})
}

func (t *Tracer) nameThread(pid, tid int, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.named[[2]int{pid, tid}] {
		return
	}
	t.named[[2]int{pid, tid}] = true
	t.meta = append(t.meta,
		Event{Name: "thread_name", Ph: "M", Pid: pid, Tid: tid, Args: map[string]any{"name": name}},
		Event{Name: "thread_sort_index", Ph: "M", Pid: pid, Tid: tid, Args: map[string]any{"sort_index": tid}})
}

// Add records events read from elsewhere (another process's trace).
func (t *Tracer) Add(evs ...Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ev := range evs {
		if ev.Ph == "M" {
			t.meta = append(t.meta, ev)
		} else {
			t.evs = append(t.evs, ev)
		}
	}
}

// Events returns a copy of the recorded events: metadata first, then the
// rest ordered by timestamp.
func (t *Tracer) Events() []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Event, 0, len(t.meta)+len(t.evs))
	out = append(out, t.meta...)
	evs := append([]Event(nil), t.evs...)
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Ts < evs[j].Ts })
	return append(out, evs...)
}

// chromeTrace is the Trace Event Format's JSON Object Format.
type chromeTrace struct {
	TraceEvents     []Event        `json:"traceEvents"`
	DisplayTimeUnit string         `json:"displayTimeUnit"`
	OtherData       map[string]any `json:"otherData,omitempty"`
}

// WriteChrome writes the events as Chrome trace-event JSON, with otherData
// (the command line, the transport, ...) stored alongside.
func (t *Tracer) WriteChrome(w io.Writer, otherData map[string]any) error {
	enc := json.NewEncoder(w)
	return enc.Encode(chromeTrace{TraceEvents: t.Events(), DisplayTimeUnit: "ms", OtherData: otherData})
}

// ReadChrome reads a trace written by WriteChrome and returns its events
// and otherData.
func ReadChrome(r io.Reader) ([]Event, map[string]any, error) {
	var ct chromeTrace
	if err := json.NewDecoder(r).Decode(&ct); err != nil {
		return nil, nil, fmt.Errorf("pipeline: reading Chrome trace: %w", err)
	}
	return ct.TraceEvents, ct.OtherData, nil
}
