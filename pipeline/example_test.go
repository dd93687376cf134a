package pipeline_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/weightcast/weightcast/pipeline"
)

// Example builds a three-stage pipeline: a source of words, a stage that
// upper-cases them, and a sink that prints them. Run starts the stages,
// closes each stream when its writer returns, and returns once all have.
func Example() {
	p := pipeline.New("words")
	words := pipeline.Source(p, "split", 2, func(ctx context.Context, out *pipeline.Output[string]) error {
		for _, w := range strings.Fields("weights flow downstream") {
			if err := out.Send(w); err != nil {
				return err
			}
		}
		return nil
	})
	upper := pipeline.Map(p, "upper", words, 2, func(ctx context.Context, w string) (string, error) {
		return strings.ToUpper(w), nil
	})
	pipeline.Sink(p, "print", upper, func(ctx context.Context, in *pipeline.Input[string]) error {
		for w := range in.All() {
			fmt.Println(w)
		}
		return in.Err()
	})
	if err := p.Run(context.Background()); err != nil {
		fmt.Println("failed:", err)
	}
	fmt.Print(p.Graph().Mermaid())
	// Output:
	// WEIGHTS
	// FLOW
	// DOWNSTREAM
	// flowchart LR
	//     %% words
	//     split([split])
	//     upper[upper]
	//     print[/print/]
	//     split -- "string, cap 2" --> upper
	//     upper -- "string, cap 2" --> print
}

// Example_failure shows the first error cancelling every stage and coming
// back once, naming its stage.
func Example_failure() {
	p := pipeline.New("failing")
	nums := pipeline.Source(p, "count", 0, func(ctx context.Context, out *pipeline.Output[int]) error {
		for i := 0; ; i++ { // runs until the sink's failure cancels it
			if err := out.Send(i); err != nil {
				return err
			}
		}
	})
	pipeline.Sink(p, "check", nums, func(ctx context.Context, in *pipeline.Input[int]) error {
		for n := range in.All() {
			if n == 3 {
				return fmt.Errorf("item %d is bad", n)
			}
		}
		return in.Err()
	})
	fmt.Println(p.Run(context.Background()))
	// Output: failing: stage check: item 3 is bad
}
