package sink_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// errInjected is the failure the sinks below inject.
var errInjected = errors.New("injected failure")

// roundModel is the model of one round: the same layout every round, new
// bytes.
func roundModel(tb testing.TB, version uint64) *source.SyntheticModel {
	tb.Helper()
	m, err := source.Synthetic{Size: 1 << 20, Tensors: 22, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: version}.Model()
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

// failAfter is a sink that keeps nothing and, when n > 0, fails at the n-th
// tensor of a round.
type failAfter struct{ n, seen int }

func (f *failAfter) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	if e.Chunk == 0 {
		f.seen++
	}
	if f.n > 0 && f.seen >= f.n {
		return errInjected
	}
	return nil
}

func (f *failAfter) Commit(ctx context.Context, version uint64) error { f.seen = 0; return nil }
func (f *failAfter) Holding() stages.Holding                          { return stages.HoldsNothing }

// failCommit is a HostModel whose Commit (this rank has the whole round)
// fails when fail is set.
type failCommit struct {
	*sink.HostModel
	fail bool
}

func (f *failCommit) Commit(ctx context.Context, version uint64) error {
	if f.fail {
		return errInjected
	}
	return f.HostModel.Commit(ctx, version)
}

// randomTensors returns count tensors of random dtypes, shapes and sizes
// from 0 to maxBytes, with random bytes.
func randomTensors(rng *rand.Rand, count int, maxBytes int64) source.Tensors {
	all := dtype.All()
	out := make(source.Tensors, count)
	for i := range out {
		d := all[rng.IntN(len(all))]
		elems := rng.Int64N(maxBytes/int64(d.Size()) + 1)
		if rng.IntN(10) == 0 {
			elems = 0
		}
		shape := []int64{elems}
		if elems > 0 && elems%4 == 0 && rng.IntN(2) == 0 {
			shape = []int64{4, elems / 4}
		}
		data := make([]byte, elems*int64(d.Size()))
		rand.NewChaCha8([32]byte{byte(i), byte(count)}).Read(data)
		out[i] = &stages.Tensor{Name: fmt.Sprintf("layer.%d.w", i), DType: d, Shape: shape, Data: data}
	}
	return out
}
