package stages

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/timeline"
)

// spansOf returns the complete spans of stage on rank pid.
func spansOf(tr *pipeline.Tracer, pid int, stage string) []pipeline.Event {
	var out []pipeline.Event
	for _, e := range tr.Events() {
		if e.Ph == "X" && e.Pid == pid && e.Cat == stage {
			out = append(out, e)
		}
	}
	return out
}

// TestTraceRates: a span carries a byte count, from which the timeline
// draws a rate, only where it timed work on those bytes: host pack,
// broadcast, receive and load always; unpack only where it checked the
// bucket's checksum (else it only makes views); publish never. The trace
// is valid for the timeline's strict check.
func TestTraceRates(t *testing.T) {
	for _, sum := range []bool{false, true} {
		tr := pipeline.NewTracer(time.Now())
		g := newGroup(t, groupOpts{world: 2, bucket: 64 << 10, checksum: sum, tracer: tr})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := g.round(ctx, roundModel(t, 1), 1, []Sink{&countSink{}}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			pid   int
			stage string
			bytes bool
		}{
			{0, "pack", true}, {0, "publish", false}, {0, "broadcast", true},
			{1, "receive", true}, {1, "unpack", sum}, {1, "load", true},
		} {
			spans := spansOf(tr, c.pid, c.stage)
			if len(spans) == 0 {
				t.Fatalf("checksum %v: rank %d has no %s spans", sum, c.pid, c.stage)
			}
			for _, e := range spans {
				if _, ok := e.Args["bytes"]; ok != c.bytes {
					t.Fatalf("checksum %v: rank %d's %s span %q has bytes: %v, want %v", sum, c.pid, c.stage, e.Name, ok, c.bytes)
				}
			}
		}
		var buf bytes.Buffer
		if err := tr.WriteChrome(&buf, nil); err != nil {
			t.Fatal(err)
		}
		if err := timeline.Validate(&buf); err != nil {
			t.Fatal(err)
		}
	}
}
