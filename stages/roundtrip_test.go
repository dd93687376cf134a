package stages

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/dtype"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// randomTensors returns count tensors of random dtypes, shapes and sizes
// from 0 to maxBytes, with random bytes.
func randomTensors(rng *rand.Rand, count int, maxBytes int64) tensorList {
	all := dtype.All()
	out := make(tensorList, count)
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
		out[i] = &Tensor{Name: fmt.Sprintf("layer.%d.w", i), DType: d, Shape: shape, Data: data}
	}
	return out
}

func TestRoundTripRandom(t *testing.T) {
	cases := []struct {
		bucket, count int
	}{
		{1 << 10, 200},
		{4 << 10, 10_000},
		{64 << 10, 300},
		{1 << 20, 50},
		{64 << 20, 3},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("bucket=%d,tensors=%d", c.bucket, c.count), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(i), 99))
			maxBytes := int64(3 * c.bucket)
			if c.count > 1000 {
				maxBytes = 256 // keep the 10k-tensor case small
			}
			src := randomTensors(rng, c.count, maxBytes)
			g := newGroup(t, groupOpts{world: 4, bucket: c.bucket, checksum: true})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			models := []*memModel{newMemModel(), newMemModel(), newMemModel()}
			for round := uint64(1); round <= 2; round++ {
				if err := g.round(ctx, src, round, []Sink{models[0], models[1], models[2]}); err != nil {
					t.Fatal(err)
				}
				for r, m := range models {
					for _, want := range src {
						got, ok := m.Get(want.Name)
						if !ok || !bytes.Equal(got.Data, want.Data) || got.DType != want.DType {
							t.Fatalf("round %d rank %d: tensor %s differs", round, r+1, want.Name)
						}
					}
					if m.Version() != round {
						t.Fatalf("rank %d at version %d", r+1, m.Version())
					}
				}
			}
			for r, m := range models {
				if m.Allocations() != len(src) {
					t.Fatalf("rank %d allocated %d times for %d tensors: not updated in place", r+1, m.Allocations(), len(src))
				}
			}
			for r, p := range g.pools {
				if p.MaxHeld() > DefaultBuffers || p.Held() != 0 {
					t.Fatalf("rank %d: max held %d, held %d", r, p.MaxHeld(), p.Held())
				}
			}
		})
	}
}
