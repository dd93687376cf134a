package stages

// The GPU's time on each device bucket of a traced round: a pair of timed
// events on a stage's stream brackets the bucket's work there, and they are
// read after the round, onto a trace lane of their own beside the stage's
// ("pack (GPU)" on the sender, Sender.traceGPU; "load (GPU)" on a receiver
// that copies into a DeviceTarget, Receiver.traceGPU). The host spans of
// such a stage only time queueing the work and waiting for it; the GPU's
// spans are the rate of the work itself.

import (
	"context"
	"fmt"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/pipeline"
)

// gpuMark is the pair of timed events around the GPU's work on one bucket.
type gpuMark struct {
	seq, round uint64
	bytes      int64
	start, end *gpu.Event
}

// gpuSpan is when the GPU worked on one bucket, in host time.
type gpuSpan struct {
	seq, round uint64
	bytes      int64
	start, end time.Time
}

// gpuMarks are the marks of one round on one stream, for the stage named
// in errors. It is used by one goroutine.
type gpuMarks struct {
	stage string
	marks []gpuMark
}

// start records, on s, the timed event that starts bucket seq's work.
func (g *gpuMarks) start(s *gpu.Stream, seq, round uint64) error {
	ev, err := s.RecordTimed()
	if err != nil {
		return fmt.Errorf("%s: recording bucket %d's start event: %w", g.stage, seq, err)
	}
	g.marks = append(g.marks, gpuMark{seq: seq, round: round, start: ev})
	return nil
}

// end records, on s, the timed event that ends bucket seq's work of
// bytes, if its start was recorded.
func (g *gpuMarks) end(s *gpu.Stream, seq uint64, bytes int64) error {
	k := len(g.marks) - 1
	if k < 0 || g.marks[k].seq != seq || g.marks[k].end != nil {
		return nil
	}
	ev, err := s.RecordTimed()
	if err != nil {
		return fmt.Errorf("%s: recording bucket %d's end event: %w", g.stage, seq, err)
	}
	g.marks[k].end, g.marks[k].bytes = ev, bytes
	return nil
}

// spans turns the marks of the round, whose work on s has finished, into
// host times and destroys them. The GPU's clock is tied to the host's by
// one more timed event, recorded on the idle stream s and waited for.
func (g *gpuMarks) spans(ctx context.Context, s *gpu.Stream) ([]gpuSpan, error) {
	if len(g.marks) == 0 {
		return nil, nil
	}
	defer g.close()
	before := time.Now()
	anchor, err := s.RecordTimed()
	if err != nil {
		return nil, fmt.Errorf("%s: recording the round's clock event: %w", g.stage, err)
	}
	defer anchor.Close()
	if err := anchor.Wait(ctx); err != nil {
		return nil, fmt.Errorf("%s: waiting for the round's clock event: %w", g.stage, err)
	}
	after := time.Now()
	at := before.Add(after.Sub(before) / 2) // when the GPU passed the anchor, give or take a few µs
	var spans []gpuSpan
	for _, m := range g.marks {
		if m.end == nil {
			continue
		}
		s, err := gpu.Elapsed(m.start, anchor)
		if err != nil {
			return nil, fmt.Errorf("%s: reading bucket %d's GPU time: %w", g.stage, m.seq, err)
		}
		e, err := gpu.Elapsed(m.end, anchor)
		if err != nil {
			return nil, fmt.Errorf("%s: reading bucket %d's GPU time: %w", g.stage, m.seq, err)
		}
		spans = append(spans, gpuSpan{seq: m.seq, round: m.round, bytes: m.bytes, start: at.Add(-s), end: at.Add(-e)})
	}
	return spans, nil
}

// close destroys the round's timed events.
func (g *gpuMarks) close() {
	for _, m := range g.marks {
		m.start.Close()
		if m.end != nil {
			m.end.Close()
		}
	}
	g.marks = g.marks[:0]
}

// gpuLaneTID is the trace thread id of a rank's GPU lane ("pack (GPU)" or
// "load (GPU)"), past the pipeline's stages (numbered from 0).
const gpuLaneTID = 1000

// gpuLane adds spans to t as lane name of rank, sorted with p's stage
// after (its GPU side); *declared says whether the lane's name was
// added to t already, and is set.
func gpuLane(t *pipeline.Tracer, p *pipeline.Pipeline, rank int, name, after string, declared *bool, spans []gpuSpan) {
	if t == nil || len(spans) == 0 {
		return
	}
	if !*declared {
		*declared = true
		order := gpuLaneTID
		for i, n := range p.Graph().Nodes {
			if n.Name == after {
				order = i // sorts with its stage, after it
			}
		}
		t.Add(pipeline.Event{Name: "thread_name", Ph: "M", Pid: rank, Tid: gpuLaneTID, Args: map[string]any{"name": name}},
			pipeline.Event{Name: "thread_sort_index", Ph: "M", Pid: rank, Tid: gpuLaneTID, Args: map[string]any{"sort_index": order}})
	}
	micros := func(at time.Time) float64 { return float64(at.Sub(t.Epoch()).Nanoseconds()) / 1e3 }
	for _, sp := range spans {
		t.Add(pipeline.Event{
			Name: fmt.Sprintf("bucket %d", sp.seq), Cat: name, Ph: "X",
			Ts: micros(sp.start), Dur: micros(sp.end) - micros(sp.start),
			Pid: rank, Tid: gpuLaneTID,
			Args: map[string]any{"stage": name, "bucket": sp.seq, "round": sp.round, "bytes": sp.bytes, "rank": rank},
		})
	}
}
