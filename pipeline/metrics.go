package pipeline

import (
	"context"
	"sync/atomic"
	"time"
)

type counters struct {
	itemsIn, itemsOut, bytes atomic.Int64
	waitNs, blockedNs        atomic.Int64
	start, end               atomic.Int64 // unix nanoseconds; 0 until set
}

// Metrics measures one stage of a run. Busy is the stage's wall time less
// the time it waited for input and the time it was blocked on output.
type Metrics struct {
	Stage      string
	ItemsIn    int64
	ItemsOut   int64
	Bytes      int64 // bytes of Sized items sent, plus CountBytes
	Wall       time.Duration
	Busy       time.Duration
	WaitIn     time.Duration // waiting for an item from upstream
	BlockedOut time.Duration // waiting for room downstream
	Running    bool          // the stage has started and not yet returned
}

// Metrics returns a snapshot of every stage's metrics, in the order the
// stages were added. It may be called while Run is in progress.
func (p *Pipeline) Metrics() []Metrics {
	out := make([]Metrics, len(p.stages))
	now := time.Now().UnixNano()
	for i, s := range p.stages {
		m := Metrics{
			Stage:      s.name,
			ItemsIn:    s.c.itemsIn.Load(),
			ItemsOut:   s.c.itemsOut.Load(),
			Bytes:      s.c.bytes.Load(),
			WaitIn:     time.Duration(s.c.waitNs.Load()),
			BlockedOut: time.Duration(s.c.blockedNs.Load()),
		}
		if start := s.c.start.Load(); start != 0 {
			end := s.c.end.Load()
			if end == 0 {
				end, m.Running = now, true
			}
			m.Wall = time.Duration(end - start)
			m.Busy = max(0, m.Wall-m.WaitIn-m.BlockedOut)
		}
		out[i] = m
	}
	return out
}

// CountBytes adds n to the byte count of the stage running with ctx, for
// work that does not leave the stage as a Sized item (a sink counts what it
// consumed this way). Outside a stage it does nothing.
func CountBytes(ctx context.Context, n int64) {
	if si := stageOf(ctx); si != nil {
		si.s.c.bytes.Add(n)
	}
}
