package stages

// The GPU's time on each device bucket of a traced round: a pair of timed
// events on the copy stream brackets the bucket's copies, and they are read
// after the round (Packer.gpuSpans, "pack (GPU)" in the trace).

import (
	"context"
	"fmt"
	"time"

	"github.com/weightcast/weightcast/gpu"
)

// gpuMark is the pair of timed events around the GPU's work on one bucket:
// start on the copy stream before the bucket's first copy, end after its
// ready event and checksum.
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

// markStart records the timed event that starts b's work on the GPU.
func (f *deviceFill) markStart(b *Bucket) error {
	ev, err := f.stream.RecordTimed()
	if err != nil {
		return fmt.Errorf("pack: recording bucket %d's start event: %w", b.Meta.Seq, err)
	}
	f.marks = append(f.marks, gpuMark{seq: b.Meta.Seq, round: b.Meta.Version, start: ev})
	return nil
}

// markEnd records the timed event that ends b's work on the GPU, if its
// start was recorded.
func (f *deviceFill) markEnd(b *Bucket) error {
	k := len(f.marks) - 1
	if k < 0 || f.marks[k].seq != b.Meta.Seq || f.marks[k].end != nil {
		return nil
	}
	ev, err := f.stream.RecordTimed()
	if err != nil {
		return fmt.Errorf("pack: recording bucket %d's end event: %w", b.Meta.Seq, err)
	}
	f.marks[k].end, f.marks[k].bytes = ev, b.Meta.Length
	return nil
}

// timeMarks turns the marks of the round, whose work has finished, into
// host times and destroys them. The GPU's clock is tied to the host's by
// one more timed event, recorded on the idle copy stream and waited for.
func (f *deviceFill) timeMarks(ctx context.Context) ([]gpuSpan, error) {
	if len(f.marks) == 0 {
		return nil, nil
	}
	defer f.closeMarks()
	before := time.Now()
	anchor, err := f.stream.RecordTimed()
	if err != nil {
		return nil, fmt.Errorf("pack: recording the round's clock event: %w", err)
	}
	defer anchor.Close()
	if err := anchor.Wait(ctx); err != nil {
		return nil, fmt.Errorf("pack: waiting for the round's clock event: %w", err)
	}
	after := time.Now()
	at := before.Add(after.Sub(before) / 2) // when the GPU passed the anchor, give or take a few µs
	var spans []gpuSpan
	for _, m := range f.marks {
		if m.end == nil {
			continue
		}
		s, err := gpu.Elapsed(m.start, anchor)
		if err != nil {
			return nil, fmt.Errorf("pack: reading bucket %d's GPU time: %w", m.seq, err)
		}
		e, err := gpu.Elapsed(m.end, anchor)
		if err != nil {
			return nil, fmt.Errorf("pack: reading bucket %d's GPU time: %w", m.seq, err)
		}
		spans = append(spans, gpuSpan{seq: m.seq, round: m.round, bytes: m.bytes, start: at.Add(-s), end: at.Add(-e)})
	}
	return spans, nil
}

// closeMarks destroys the round's timed events.
func (f *deviceFill) closeMarks() {
	for _, m := range f.marks {
		m.start.Close()
		if m.end != nil {
			m.end.Close()
		}
	}
	f.marks = f.marks[:0]
}
