package timeline

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// bigTrace is a trace of 8 ranks with 4 stages each and 1000 buckets:
// 32,000 complete events.
func bigTrace(b *testing.B) string {
	b.Helper()
	stages := []string{"subscribe", "broadcast", "unpack", "load"}
	var evs []ev
	for pid := 0; pid < 8; pid++ {
		evs = append(evs, processName(pid, "rank"))
		for tid, st := range stages {
			evs = append(evs, threadName(pid, tid, st))
			for k := 0; k < 1000; k++ {
				evs = append(evs, span(pid, tid, st, k, float64(k)*100+float64(tid)*10, 90))
			}
		}
	}
	return traceJSON(b, evs...)
}

func BenchmarkRead(b *testing.B) {
	for _, tc := range []struct {
		name  string
		trace string
	}{{"fixture", mustFile(b, "testdata/pipeline.json")}, {"32k-spans", bigTrace(b)}} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.trace)))
			for b.Loop() {
				if _, err := Read(strings.NewReader(tc.trace)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkValidate(b *testing.B) {
	trace := bigTrace(b)
	b.SetBytes(int64(len(trace)))
	for b.Loop() {
		if err := Validate(strings.NewReader(trace)); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRender(b *testing.B) {
	for _, tc := range []struct {
		name  string
		trace string
	}{{"fixture", mustFile(b, "testdata/pipeline.json")}, {"32k-spans", bigTrace(b)}} {
		b.Run(tc.name, func(b *testing.B) {
			tr := mustRead(b, tc.trace)
			var buf bytes.Buffer
			if err := Render(&buf, tr, Options{}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(buf.Len()), "svg-bytes")
			for b.Loop() {
				if err := Render(io.Discard, tr, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
