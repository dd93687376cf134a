package route

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/stages"
)

// Dim0 returns sender i of n's shards of every tensor of src: each
// tensor's dim-0 chunk as torch.chunk (and FSDP) splits it (ceil(rows/n)
// rows each, the last senders' shorter or empty; a scalar goes whole to
// sender 0), read from its host bytes (Data or Reader, cast as the tensor says). A dim-0 chunk is
// one contiguous range of the tensor's bytes, so only that range is read.
func Dim0(ctx context.Context, src stages.Source, i, n int) ([]Local, error) {
	if n < 1 || i < 0 || i >= n {
		return nil, fmt.Errorf("route: sender %d of %d", i, n)
	}
	var out []Local
	err := src.Tensors(ctx, func(t *stages.Tensor) error {
		if t.Device != nil {
			return fmt.Errorf("route: tensor %s is in device memory; routed rounds take host tensors", t.Name)
		}
		s, ok := layout.ChunkDim0(layout.Full(t.Shape), i, n)
		if !ok {
			return nil
		}
		size, err := t.Size()
		if err != nil {
			return err
		}
		lo, hi := int64(0), size
		if len(t.Shape) > 0 && t.Shape[0] > 0 {
			row := size / t.Shape[0]
			lo, hi = s.Offset[0]*row, (s.Offset[0]+s.Size[0])*row
		}
		b := make([]byte, hi-lo)
		if err := t.ReadAt(b, lo); err != nil {
			return fmt.Errorf("route: reading tensor %s: %w", t.Name, err)
		}
		out = append(out, Local{Shard: Shard{Name: t.Name, DType: t.DType, Shape: t.Shape, Offset: s.Offset, Size: s.Size}, Data: b})
		return nil
	})
	return out, err
}
