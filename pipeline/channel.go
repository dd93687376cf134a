package pipeline

import (
	"context"
	"iter"
	"time"
)

// Input is a stage's end of its input stream. Only the stage's own
// goroutine may use it.
type Input[T any] struct {
	ch   <-chan T
	s    *stage
	ctx  context.Context
	done <-chan struct{}
}

func newInput[T any](ch <-chan T, s *stage) *Input[T] { return &Input[T]{ch: ch, s: s} }

func (in *Input[T]) bind(ctx context.Context) { in.ctx, in.done = ctx, ctx.Done() }

// Recv returns the next item. ok is false when the upstream stage has
// closed the stream, or when the pipeline is cancelled (then Err is set).
func (in *Input[T]) Recv() (item T, ok bool) {
	select {
	case <-in.done:
		return item, false
	default:
	}
	select {
	case item, ok = <-in.ch:
	default:
		// The channel is empty: wait, and count the wait.
		t0 := time.Now()
		select {
		case item, ok = <-in.ch:
		case <-in.done:
		}
		in.s.c.waitNs.Add(int64(time.Since(t0)))
	}
	if ok {
		in.s.c.itemsIn.Add(1)
	}
	return item, ok
}

// TryRecv is Recv without the wait: ready is false when no item has
// arrived yet and the stream is still open, and then item and ok say
// nothing. A stage that holds work back for the next item uses it to
// finish that work first when the next item is not there, rather than
// wait for an item that may only come once its work is done.
func (in *Input[T]) TryRecv() (item T, ok, ready bool) {
	select {
	case <-in.done:
		return item, false, true
	default:
	}
	select {
	case item, ok = <-in.ch:
	default:
		return item, false, false
	}
	if ok {
		in.s.c.itemsIn.Add(1)
	}
	return item, ok, true
}

// All ranges over the items until the stream closes or the pipeline is
// cancelled. After the loop, Err tells which.
func (in *Input[T]) All() iter.Seq[T] {
	return func(yield func(T) bool) {
		for {
			item, ok := in.Recv()
			if !ok || !yield(item) {
				return
			}
		}
	}
}

// Err returns the pipeline's cancellation cause, or nil while it runs.
func (in *Input[T]) Err() error {
	if in.ctx.Err() != nil {
		return errCancelled(in.ctx)
	}
	return nil
}

// Output is a stage's end of its output stream. Only the stage's own
// goroutine may use it; the runner closes it when the stage returns.
type Output[T any] struct {
	ch    chan<- T
	s     *stage
	ctx   context.Context
	done  <-chan struct{}
	sized bool
}

func newOutput[T any](ch chan<- T, s *stage) *Output[T] {
	_, sized := any(*new(T)).(Sized)
	return &Output[T]{ch: ch, s: s, sized: sized}
}

func (o *Output[T]) bind(ctx context.Context) { o.ctx, o.done = ctx, ctx.Done() }

// Send passes item downstream, blocking while the stream is full. If the
// pipeline is cancelled first, Send releases item (when it is a Releaser) and
// returns the cancellation cause: the caller must not use item afterwards.
func (o *Output[T]) Send(item T) error {
	select {
	case <-o.done:
		release(item)
		return errCancelled(o.ctx)
	default:
	}
	var n int64
	if o.sized {
		n = any(item).(Sized).ByteSize()
	}
	select {
	case o.ch <- item:
	default:
		t0 := time.Now()
		select {
		case o.ch <- item:
			o.s.c.blockedNs.Add(int64(time.Since(t0)))
		case <-o.done:
			o.s.c.blockedNs.Add(int64(time.Since(t0)))
			release(item)
			return errCancelled(o.ctx)
		}
	}
	o.s.c.itemsOut.Add(1)
	o.s.c.bytes.Add(n)
	return nil
}
