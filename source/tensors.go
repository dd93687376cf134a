package source

import (
	"context"

	"github.com/weightcast/weightcast/stages"
)

// Tensors is a stages.Source over a fixed list of tensors.
type Tensors []*stages.Tensor

// Tensors emits each tensor of the list in order.
func (ts Tensors) Tensors(ctx context.Context, emit func(*stages.Tensor) error) error {
	for _, t := range ts {
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}
