package pipeline

import (
	"context"
	"testing"
)

// BenchmarkFramework passes b.N ints through a source, three pass-through
// stages and a sink: five stages joined by channels of capacity 4.
func BenchmarkFramework(b *testing.B) {
	p := New("bench")
	s := Source(p, "src", 4, func(ctx context.Context, out *Output[int]) error {
		for i := range b.N {
			if err := out.Send(i); err != nil {
				return err
			}
		}
		return nil
	})
	for _, name := range []string{"a", "b", "c"} {
		s = Stage(p, name, s, 4, func(ctx context.Context, in *Input[int], out *Output[int]) error {
			for v := range in.All() {
				if err := out.Send(v); err != nil {
					return err
				}
			}
			return nil
		})
	}
	Sink(p, "sink", s, func(ctx context.Context, in *Input[int]) error {
		for range in.All() {
		}
		return nil
	})
	b.ResetTimer()
	if err := p.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkHandWritten is the same chain written by hand: five goroutines,
// channels of capacity 4, every send and receive also watching ctx.Done().
func BenchmarkHandWritten(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := ctx.Done()
	src := make(chan int, 4)
	go func() {
		defer close(src)
		for i := range b.N {
			select {
			case src <- i:
			case <-done:
				return
			}
		}
	}()
	in := src
	for range 3 {
		out := make(chan int, 4)
		go func(in <-chan int, out chan<- int) {
			defer close(out)
			for {
				select {
				case v, ok := <-in:
					if !ok {
						return
					}
					select {
					case out <- v:
					case <-done:
						return
					}
				case <-done:
					return
				}
			}
		}(in, out)
		in = out
	}
	b.ResetTimer()
	for {
		select {
		case _, ok := <-in:
			if !ok {
				return
			}
		case <-done:
			return
		}
	}
}
