package pipeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counted is an item that records its release.
type counted struct {
	n        int
	released *atomic.Int64
}

func (c counted) Release()        { c.released.Add(1) }
func (c counted) ByteSize() int64 { return 10 }

func numbers(n int, released *atomic.Int64) func(context.Context, *Output[counted]) error {
	return func(ctx context.Context, out *Output[counted]) error {
		for i := range n {
			if err := out.Send(counted{i, released}); err != nil {
				return err
			}
		}
		return nil
	}
}

func TestChainDeliversInOrder(t *testing.T) {
	var rel atomic.Int64
	p := New("t")
	src := Source(p, "gen", 2, numbers(1000, &rel))
	sq := Map(p, "double", src, 1, func(ctx context.Context, c counted) (counted, error) { c.n *= 2; return c, nil })
	even := Filter(p, "drop-multiples-of-4", sq, 1, func(c counted) bool { return c.n%4 != 0 })
	var got []int
	Sink(p, "collect", even, func(ctx context.Context, in *Input[counted]) error {
		for c := range in.All() {
			got = append(got, c.n)
			c.Release()
		}
		return in.Err()
	})
	if err := p.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(got) != 500 || got[0] != 2 || got[499] != 1998 {
		t.Fatalf("got %d items, first %v", len(got), got[:3])
	}
	if rel.Load() != 1000 {
		t.Fatalf("released %d of 1000 items", rel.Load())
	}
	m := p.Metrics()
	if m[0].ItemsOut != 1000 || m[0].Bytes != 10000 || m[3].ItemsIn != 500 {
		t.Fatalf("metrics: %+v", m)
	}
	for _, s := range m {
		if s.Running || s.Wall <= 0 || s.Busy < 0 || s.Busy > s.Wall {
			t.Fatalf("stage %s: bad times %+v", s.Stage, s)
		}
	}
}

// TestFirstErrorCancelsAllAndSurfacesOnce: whichever stage fails, Run
// returns that stage's error and every other stage stops; items left in
// channels are released.
func TestFirstErrorCancelsAllAndSurfacesOnce(t *testing.T) {
	boom := errors.New("boom")
	for _, failing := range []string{"gen", "mid", "sink"} {
		t.Run(failing, func(t *testing.T) {
			var rel atomic.Int64
			var sent atomic.Int64
			p := New("t")
			src := Source(p, "gen", 4, func(ctx context.Context, out *Output[counted]) error {
				for i := 0; ; i++ {
					if failing == "gen" && i == 50 {
						return boom
					}
					sent.Add(1) // created: Send releases it if it cannot deliver
					if err := out.Send(counted{i, &rel}); err != nil {
						return err
					}
				}
			})
			mid := Stage(p, "mid", src, 4, func(ctx context.Context, in *Input[counted], out *Output[counted]) error {
				for c := range in.All() {
					if failing == "mid" && c.n == 50 {
						c.Release()
						return boom
					}
					if err := out.Send(c); err != nil {
						return err
					}
				}
				return in.Err()
			})
			Sink(p, "sink", mid, func(ctx context.Context, in *Input[counted]) error {
				for c := range in.All() {
					c.Release()
					if failing == "sink" && c.n == 50 {
						return boom
					}
				}
				return in.Err()
			})
			err := p.Run(context.Background())
			var se *StageError
			if !errors.As(err, &se) || se.Stage != failing || !errors.Is(err, boom) {
				t.Fatalf("Run = %v; want boom from stage %s", err, failing)
			}
			if strings.Count(err.Error(), "boom") != 1 {
				t.Fatalf("error repeated: %v", err)
			}
			if rel.Load() != sent.Load() {
				t.Fatalf("created %d items, released %d", sent.Load(), rel.Load())
			}
		})
	}
}

func TestPanicBecomesError(t *testing.T) {
	p := New("t")
	src := Source(p, "gen", 0, func(ctx context.Context, out *Output[int]) error { panic("oops") })
	Sink(p, "sink", src, func(ctx context.Context, in *Input[int]) error {
		for range in.All() {
		}
		return nil
	})
	err := p.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "oops") || !strings.Contains(err.Error(), "stage gen") {
		t.Fatalf("Run = %v", err)
	}
}

// TestCancelWhileBlocked: cancelling the context reaches stages blocked on
// a full output and on an empty input.
func TestCancelWhileBlocked(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := New("t")
	src := Source(p, "gen", 0, func(ctx context.Context, out *Output[int]) error {
		for i := 0; ; i++ {
			if err := out.Send(i); err != nil {
				return err
			}
		}
	})
	Sink(p, "stuck", src, func(ctx context.Context, in *Input[int]) error {
		in.Recv()
		<-ctx.Done() // a sink busy with something else
		return ctx.Err()
	})
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if err := p.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v; want context.Canceled", err)
	}
}

// TestEarlyReturnDrains: a sink that stops reading early returns nil; the
// source still finishes because the runner drains and releases the rest.
func TestEarlyReturnDrains(t *testing.T) {
	var rel atomic.Int64
	p := New("t")
	src := Source(p, "gen", 1, numbers(100, &rel))
	Sink(p, "first", src, func(ctx context.Context, in *Input[counted]) error {
		c, _ := in.Recv()
		c.Release()
		return nil
	})
	if err := p.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rel.Load() != 100 {
		t.Fatalf("released %d of 100", rel.Load())
	}
}

func TestBuildErrors(t *testing.T) {
	p := New("t")
	Source(p, "gen", 1, func(ctx context.Context, out *Output[int]) error { return nil })
	if err := p.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "read by no stage") {
		t.Fatalf("dangling output: %v", err)
	}
	if err := p.Run(context.Background()); err == nil {
		t.Fatal("second Run succeeded")
	}
	mustPanic(t, "duplicate name", func() {
		p := New("t")
		Source(p, "a", 1, func(ctx context.Context, out *Output[int]) error { return nil })
		Source(p, "a", 1, func(ctx context.Context, out *Output[int]) error { return nil })
	})
	mustPanic(t, "stream read twice", func() {
		p := New("t")
		s := Source(p, "a", 1, func(ctx context.Context, out *Output[int]) error { return nil })
		Sink(p, "b", s, func(ctx context.Context, in *Input[int]) error { return nil })
		Sink(p, "c", s, func(ctx context.Context, in *Input[int]) error { return nil })
	})
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatalf("%s: no panic", what)
		}
	}()
	f()
}

func TestGraphMermaid(t *testing.T) {
	p := New("demo")
	a := Source(p, "iterate", 2, func(ctx context.Context, out *Output[*counted]) error { return nil })
	b := Map(p, "pack", a, 1, func(ctx context.Context, c *counted) (int, error) { return 0, nil })
	Sink(p, "load", b, func(ctx context.Context, in *Input[int]) error { return nil })
	g := p.Graph()
	if len(g.Nodes) != 3 || len(g.Edges) != 2 || g.Edges[0].Capacity != 2 {
		t.Fatalf("graph: %+v", g)
	}
	want := "flowchart LR\n    %% demo\n    iterate([iterate])\n    pack[pack]\n    load[/load/]\n" +
		"    iterate -- \"pipeline.counted, cap 2\" --> pack\n    pack -- \"int, cap 1\" --> load\n"
	if got := g.Mermaid(); got != want {
		t.Fatalf("Mermaid:\n%s\nwant:\n%s", got, want)
	}
}

func TestTraceSpans(t *testing.T) {
	tr := NewTracer(time.Now())
	tr.NameProcess(0, "rank 0")
	p := New("t", WithTracer(tr, 0))
	src := Source(p, "gen", 1, func(ctx context.Context, out *Output[int]) error {
		for i := range 3 {
			sp := StartSpan(ctx, "item", map[string]any{"bucket": i})
			Count(ctx, "buffers", float64(i))
			sp.End()
			if err := out.Send(i); err != nil {
				return err
			}
		}
		return nil
	})
	Sink(p, "sink", src, func(ctx context.Context, in *Input[int]) error {
		for range in.All() {
		}
		return nil
	})
	if err := p.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := tr.WriteChrome(&buf, map[string]any{"command": "test"}); err != nil {
		t.Fatal(err)
	}
	evs, other, err := ReadChrome(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var spans, counters, meta int
	for _, e := range evs {
		switch e.Ph {
		case "X":
			spans++
			if e.Cat != "gen" || e.Args["stage"] != "gen" || e.Dur < 0 {
				t.Fatalf("bad span %+v", e)
			}
		case "C":
			counters++
		case "M":
			meta++
		}
	}
	if spans != 3 || counters != 3 || meta != 6 || other["command"] != "test" {
		t.Fatalf("spans %d counters %d meta %d other %v", spans, counters, meta, other)
	}
}

func TestStartSpanWithoutTracerIsNil(t *testing.T) {
	sp := StartSpan(context.Background(), "x", nil)
	if sp != nil {
		t.Fatal("span without tracer")
	}
	sp.End()
}

// TestHelpersReleaseFailedItems holds Map and Filter to their contract: an
// item whose function fails (an error, or a panic, which Run reports as the
// stage's error) is released, so every item created is released once,
// whichever item fails and whatever the stages downstream hold.
func TestHelpersReleaseFailedItems(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name  string
		build func(p *Pipeline, in *Stream[counted]) *Stream[counted]
		want  string
	}{
		{"Map error", func(p *Pipeline, in *Stream[counted]) *Stream[counted] {
			return Map(p, "helper", in, 1, func(ctx context.Context, c counted) (counted, error) {
				if c.n == 7 {
					return counted{}, boom
				}
				return c, nil
			})
		}, "boom"},
		{"Map panic", func(p *Pipeline, in *Stream[counted]) *Stream[counted] {
			return Map(p, "helper", in, 1, func(ctx context.Context, c counted) (counted, error) {
				if c.n == 7 {
					panic("boom")
				}
				return c, nil
			})
		}, "boom"},
		{"Filter panic", func(p *Pipeline, in *Stream[counted]) *Stream[counted] {
			return Filter(p, "helper", in, 1, func(c counted) bool {
				if c.n == 7 {
					panic("boom")
				}
				return c.n%2 == 0
			})
		}, "boom"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var rel, sent atomic.Int64
			p := New("t")
			src := Source(p, "gen", 4, func(ctx context.Context, out *Output[counted]) error {
				for i := range 100 {
					sent.Add(1) // created: Send releases it if it cannot deliver
					if err := out.Send(counted{i, &rel}); err != nil {
						return err
					}
				}
				return nil
			})
			Sink(p, "sink", c.build(p, src), func(ctx context.Context, in *Input[counted]) error {
				for c := range in.All() {
					c.Release()
				}
				return in.Err()
			})
			err := p.Run(context.Background())
			var se *StageError
			if !errors.As(err, &se) || se.Stage != "helper" || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Run = %v; want %q from stage helper", err, c.want)
			}
			if rel.Load() != sent.Load() {
				t.Fatalf("created %d items, released %d: the failed item was lost", sent.Load(), rel.Load())
			}
		})
	}
}

// TestFailComesFirst: a stage that calls Fail before telling the world
// of its failure (here: a channel another goroutine waits on, which then
// cancels Run's context, as a peer told of the failure would end the
// round) has Run report its error, not the cancellation that followed.
func TestFailComesFirst(t *testing.T) {
	for range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		told := make(chan struct{})
		go func() { <-told; cancel() }()
		p := New("fail")
		src := Source(p, "src", 1, func(ctx context.Context, out *Output[int]) error { return out.Send(1) })
		Sink(p, "sink", src, func(ctx context.Context, in *Input[int]) error {
			for range in.All() {
				err := errors.New("bucket 3 failed its MAC")
				Fail(ctx, err)
				close(told)
				<-ctx.Done() // the cancellation has happened
				return err
			}
			return in.Err()
		})
		err := p.Run(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "failed its MAC") {
			t.Fatalf("Run: %v; want the stage's failure", err)
		}
	}
}

// TestTryRecv: TryRecv is not ready while the stream is open and empty,
// hands over each item once it has arrived, and is ready with ok false
// once the stream is closed; the items it took count as the stage's.
func TestTryRecv(t *testing.T) {
	p := New("t")
	next := make(chan struct{})
	src := Source(p, "gen", 0, func(ctx context.Context, out *Output[int]) error {
		for i := range 3 {
			<-next
			if err := out.Send(i); err != nil {
				return err
			}
		}
		return nil
	})
	var got []int
	Sink(p, "try", src, func(ctx context.Context, in *Input[int]) error {
		for i := range 3 {
			if _, _, ready := in.TryRecv(); ready {
				return fmt.Errorf("item %d: ready before it was sent", i)
			}
			next <- struct{}{}
			for {
				item, ok, ready := in.TryRecv()
				if !ready {
					runtime.Gosched()
					continue
				}
				if !ok {
					return fmt.Errorf("item %d: the stream ended early", i)
				}
				got = append(got, item)
				break
			}
		}
		for {
			if _, ok, ready := in.TryRecv(); ready {
				if ok {
					return errors.New("an item after the last")
				}
				return nil
			}
			runtime.Gosched()
		}
	})
	if err := p.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[0 1 2]" {
		t.Fatalf("got %v, want [0 1 2]", got)
	}
	for _, m := range p.Metrics() {
		if m.Stage == "try" && m.ItemsIn != 3 {
			t.Fatalf("the sink counted %d items in, want 3", m.ItemsIn)
		}
	}
}
