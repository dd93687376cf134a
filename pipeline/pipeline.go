package pipeline

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/sourcegraph/conc/panics"
	"golang.org/x/sync/errgroup"
)

// Releaser is implemented by items that hold a resource (a bucket buffer)
// which must be given back when the item is dropped instead of consumed.
type Releaser interface{ Release() }

// Sized is implemented by items that carry a payload; the pipeline adds
// ByteSize to its stage's byte count when the item is sent.
type Sized interface{ ByteSize() int64 }

// Pipeline is a set of stages joined by bounded channels. Build it with
// Source, Stage, Map, Filter and Sink, then call Run once.
type Pipeline struct {
	name   string
	tracer *Tracer
	pid    int
	stages []*stage
	edges  []Edge
	ran    bool
}

// Option configures a Pipeline.
type Option func(*Pipeline)

// WithTracer records the stages' spans in t under process id pid (the rank,
// for a weight-sync pipeline). Several pipelines may share one Tracer.
func WithTracer(t *Tracer, pid int) Option {
	return func(p *Pipeline) { p.tracer, p.pid = t, pid }
}

// New returns an empty pipeline called name.
func New(name string, opts ...Option) *Pipeline {
	p := &Pipeline{name: name}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Name returns the pipeline's name.
func (p *Pipeline) Name() string { return p.name }

type stage struct {
	name    string
	tid     int
	run     func(ctx context.Context) error
	drain   func() // drains the input after run returns; nil for sources
	closeFn func() // closes the output; nil for sinks
	c       counters
}

// kind is "source" for a stage with no input, "sink" for one with no
// output, and "stage" for the others.
func (s *stage) kind() string {
	switch {
	case s.drain == nil:
		return "source"
	case s.closeFn == nil:
		return "sink"
	}
	return "stage"
}

// Stream is the typed, bounded channel between two stages. It is created by
// the stage that writes it and consumed by exactly one later stage.
type Stream[T any] struct {
	p        *Pipeline
	ch       chan T
	from     *stage
	consumed bool
}

// Capacity is the stream's channel capacity.
func (s *Stream[T]) Capacity() int { return cap(s.ch) }

func (p *Pipeline) addStage(name string) *stage {
	if p.ran {
		panic("pipeline: " + p.name + ": stage " + name + " added after Run")
	}
	for _, s := range p.stages {
		if s.name == name {
			panic("pipeline: " + p.name + ": two stages named " + name)
		}
	}
	s := &stage{name: name, tid: len(p.stages)}
	p.stages = append(p.stages, s)
	return s
}

func newStream[T any](p *Pipeline, from *stage, capacity int) *Stream[T] {
	if capacity < 0 {
		panic(fmt.Sprintf("pipeline: %s: stage %s: negative channel capacity %d", p.name, from.name, capacity))
	}
	ch := make(chan T, capacity)
	from.closeFn = func() { close(ch) }
	return &Stream[T]{p: p, ch: ch, from: from}
}

func consume[T any](p *Pipeline, in *Stream[T], to *stage) {
	if in.p != p {
		panic("pipeline: " + p.name + ": stage " + to.name + " reads a stream of another pipeline")
	}
	if in.consumed {
		panic("pipeline: " + p.name + ": stream from " + in.from.name + " read by two stages")
	}
	in.consumed = true
	p.edges = append(p.edges, Edge{From: in.from.name, To: to.name, Capacity: in.Capacity(), Type: typeName[T]()})
	to.drain = func() {
		for item := range in.ch {
			release(item)
		}
	}
}

func typeName[T any]() string { return reflect.TypeFor[T]().String() }

func release[T any](item T) {
	if r, ok := any(item).(Releaser); ok {
		r.Release()
	}
}

// Source adds a stage with no input that writes items to out. The runner
// closes out when fn returns. capacity is the channel capacity of the
// returned stream.
func Source[T any](p *Pipeline, name string, capacity int, fn func(ctx context.Context, out *Output[T]) error) *Stream[T] {
	s := p.addStage(name)
	st := newStream[T](p, s, capacity)
	out := newOutput(st.ch, s)
	s.run = func(ctx context.Context) error { out.bind(ctx); return fn(ctx, out) }
	return st
}

// Stage adds a stage that reads in and writes the returned stream. The
// runner closes the returned stream when fn returns, then drains whatever
// fn left in in.
func Stage[I, O any](p *Pipeline, name string, in *Stream[I], capacity int, fn func(ctx context.Context, in *Input[I], out *Output[O]) error) *Stream[O] {
	s := p.addStage(name)
	consume(p, in, s)
	st := newStream[O](p, s, capacity)
	inp, out := newInput(in.ch, s), newOutput(st.ch, s)
	s.run = func(ctx context.Context) error { inp.bind(ctx); out.bind(ctx); return fn(ctx, inp, out) }
	return st
}

// Sink adds the last stage of a chain: it reads in and writes nothing.
func Sink[T any](p *Pipeline, name string, in *Stream[T], fn func(ctx context.Context, in *Input[T]) error) {
	s := p.addStage(name)
	consume(p, in, s)
	inp := newInput(in.ch, s)
	s.run = func(ctx context.Context) error { inp.bind(ctx); return fn(ctx, inp) }
}

// Map adds a stage that applies fn to every item. If fn fails (returns an
// error or panics), the pipeline stops with the error and the item (when it
// is a Releaser) is released; what fn returned with the error is ignored.
func Map[I, O any](p *Pipeline, name string, in *Stream[I], capacity int, fn func(ctx context.Context, item I) (O, error)) *Stream[O] {
	return Stage(p, name, in, capacity, func(ctx context.Context, in *Input[I], out *Output[O]) error {
		for item := range in.All() {
			o, err := releaseOnFailure(item, func() (O, error) { return fn(ctx, item) })
			if err != nil {
				return err
			}
			if err := out.Send(o); err != nil {
				return err
			}
		}
		return nil
	})
}

// Filter adds a stage that passes on the items for which keep returns true
// and releases the others, and the item on which keep panics.
func Filter[T any](p *Pipeline, name string, in *Stream[T], capacity int, keep func(item T) bool) *Stream[T] {
	return Stage(p, name, in, capacity, func(ctx context.Context, in *Input[T], out *Output[T]) error {
		for item := range in.All() {
			kept, _ := releaseOnFailure(item, func() (bool, error) { return keep(item), nil })
			if !kept {
				release(item)
				continue
			}
			if err := out.Send(item); err != nil {
				return err
			}
		}
		return nil
	})
}

// releaseOnFailure returns f's results, and releases item (when it is a
// Releaser) where f returns an error or panics; the panic goes on to the
// runner, which reports it as the stage's error.
func releaseOnFailure[T, R any](item T, f func() (R, error)) (r R, err error) {
	ok := false
	defer func() {
		if !ok {
			release(item)
		}
	}()
	r, err = f()
	ok = err == nil
	return r, err
}

// StageError is the error Run returns: the first stage that failed and why.
type StageError struct {
	Pipeline string
	Stage    string
	Err      error
}

// Error says which pipeline and stage failed, and why.
func (e *StageError) Error() string {
	return fmt.Sprintf("%s: stage %s: %v", e.Pipeline, e.Stage, e.Err)
}

// Unwrap returns the stage's own error.
func (e *StageError) Unwrap() error { return e.Err }

// Run starts every stage on its own goroutine and blocks until all have
// returned. It returns the first stage's error (a *StageError), or ctx's
// error if ctx ended before the stream did. Run may be called once.
func (p *Pipeline) Run(ctx context.Context) error {
	if p.ran {
		return fmt.Errorf("pipeline: %s: Run called twice", p.name)
	}
	p.ran = true
	if err := p.check(); err != nil {
		return err
	}
	if p.tracer != nil {
		for _, s := range p.stages {
			p.tracer.nameThread(p.pid, s.tid, s.name)
		}
	}
	// The first failing stage cancels the others through cctx before it
	// drains its input, and its error becomes the cause that Run reports.
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var g errgroup.Group
	for _, s := range p.stages {
		g.Go(func() error { return p.runStage(cctx, cancel, s) })
	}
	if err := g.Wait(); err == nil {
		return ctx.Err()
	}
	return context.Cause(cctx)
}

func (p *Pipeline) check() error {
	if len(p.stages) == 0 {
		return fmt.Errorf("pipeline: %s: no stages", p.name)
	}
	read := map[string]bool{}
	for _, e := range p.edges {
		read[e.From] = true
	}
	for _, s := range p.stages {
		if s.closeFn != nil && !read[s.name] {
			return fmt.Errorf("pipeline: %s: the output of stage %s is read by no stage; end the chain with Sink", p.name, s.name)
		}
	}
	return nil
}

func (p *Pipeline) runStage(ctx context.Context, cancel context.CancelCauseFunc, s *stage) (err error) {
	sctx := withStage(ctx, p, s, cancel)
	s.c.start.Store(time.Now().UnixNano())
	defer func() { s.c.end.Store(time.Now().UnixNano()) }()
	var pc panics.Catcher
	pc.Try(func() { err = s.run(sctx) })
	if r := pc.Recovered(); r != nil {
		err = r.AsError()
	}
	if err != nil {
		// Only the first cancel sets the cause: a stage that merely
		// noticed another's failure does not replace it.
		err = &StageError{Pipeline: p.name, Stage: s.name, Err: err}
		cancel(err)
	}
	if s.closeFn != nil {
		s.closeFn()
	}
	if s.drain != nil {
		s.drain()
	}
	return err
}

// errCancelled reports why a channel operation gave up.
func errCancelled(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return errors.New("pipeline: cancelled")
}
