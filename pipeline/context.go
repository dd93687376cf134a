package pipeline

import (
	"context"
	"time"
)

type stageKey struct{}

type stageInfo struct {
	p      *Pipeline
	s      *stage
	cancel context.CancelCauseFunc // the pipeline's: Fail records a failure with it
}

func withStage(ctx context.Context, p *Pipeline, s *stage, cancel context.CancelCauseFunc) context.Context {
	return context.WithValue(ctx, stageKey{}, &stageInfo{p: p, s: s, cancel: cancel})
}

// Fail records err as the failure of the stage running with ctx at once,
// as returning it would record it: the pipeline is cancelled with it
// (unless another failure came first) before the stage does anything
// more. A stage calls it before work that others observe as a consequence
// of its failure, such as giving back an item whose release tells another
// process that the item was not used, so that Run reports err and not
// what the others did about it. It returns err, which the stage still
// returns; a nil err, or a ctx of no stage, records nothing.
func Fail(ctx context.Context, err error) error {
	if si := stageOf(ctx); si != nil && err != nil {
		si.cancel(&StageError{Pipeline: si.p.name, Stage: si.s.name, Err: err})
	}
	return err
}

func stageOf(ctx context.Context) *stageInfo {
	si, _ := ctx.Value(stageKey{}).(*stageInfo)
	return si
}

// StageName returns the name of the stage running with ctx, or "".
func StageName(ctx context.Context) string {
	if si := stageOf(ctx); si != nil {
		return si.s.name
	}
	return ""
}

// Span is an open trace span; End closes it. A nil *Span (tracing off) is
// valid and End does nothing.
type Span struct {
	t     *Tracer
	ev    Event
	start time.Time
}

// StartSpan opens a span called name on the lane of the stage running with
// ctx. args are recorded with the span (for example "bucket": 3,
// "bytes": 1<<20). When the pipeline has no Tracer it returns nil, cheaply.
func StartSpan(ctx context.Context, name string, args map[string]any) *Span {
	si := stageOf(ctx)
	if si == nil || si.p.tracer == nil {
		return nil
	}
	if args == nil {
		args = map[string]any{}
	}
	args["stage"] = si.s.name
	args["rank"] = si.p.pid
	return &Span{t: si.p.tracer, start: time.Now(), ev: Event{
		Name: name, Cat: si.s.name, Ph: "X", Pid: si.p.pid, Tid: si.s.tid, Args: args,
	}}
}

// End closes the span and records it.
func (s *Span) End() {
	if s == nil {
		return
	}
	s.ev.Ts = s.t.micros(s.start)
	s.ev.Dur = float64(time.Since(s.start).Nanoseconds()) / 1e3
	s.t.add(s.ev)
}

// Count records a counter sample (a Chrome trace "C" event) named name on
// the process of the stage running with ctx, for example the number of
// bucket buffers a rank holds.
func Count(ctx context.Context, name string, value float64) {
	si := stageOf(ctx)
	if si == nil || si.p.tracer == nil {
		return
	}
	t := si.p.tracer
	t.add(Event{Name: name, Ph: "C", Pid: si.p.pid, Ts: t.micros(time.Now()), Args: map[string]any{"value": value}})
}

// Args adds args to the span's recorded arguments.
func (s *Span) Args(args map[string]any) {
	if s == nil {
		return
	}
	for k, v := range args {
		s.ev.Args[k] = v
	}
}
