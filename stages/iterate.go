package stages

import (
	"context"

	"github.com/weightcast/weightcast/pipeline"
)

// Iterate adds the source stage that yields src's tensors. The runner closes
// the returned stream after the last one.
func Iterate(p *pipeline.Pipeline, src Source) *pipeline.Stream[*Tensor] {
	return pipeline.Source(p, "iterate", 64, func(ctx context.Context, out *pipeline.Output[*Tensor]) error {
		return src.Tensors(ctx, out.Send)
	})
}
