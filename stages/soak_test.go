package stages

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
)

// soakLayout is the model of one soak round: the same tensor names every
// round, each with a dtype and shape drawn from seed (some larger than a
// bucket, some empty), and bytes drawn from seed too. Seed 0 is the
// reference layout the memory is measured at.
func soakLayout(seed uint64, names int, bucket int64) tensorList {
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	types := []dtype.DType{dtype.BF16, dtype.F16, dtype.F32, dtype.U8, dtype.I64}
	out := make(tensorList, names)
	for i := range out {
		d := types[rng.IntN(len(types))]
		maxElems := bucket / 2 / int64(d.Size())
		if rng.IntN(8) == 0 {
			maxElems = 3 * bucket / int64(d.Size()) // split across buckets
		}
		elems := rng.Int64N(maxElems + 1)
		if rng.IntN(16) == 0 {
			elems = 0
		}
		shape := []int64{elems}
		if elems%8 == 0 && elems > 0 && rng.IntN(2) == 0 {
			shape = []int64{8, elems / 8}
		}
		data := make([]byte, elems*int64(d.Size()))
		var key [32]byte
		copy(key[:], strconv.FormatUint(seed, 10)+"/"+strconv.Itoa(i))
		rand.NewChaCha8(key).Read(data)
		out[i] = &Tensor{Name: fmt.Sprintf("soak.%02d.weight", i), DType: d, Shape: shape, Data: data}
	}
	return out
}

// heapInuse is the heap in use after a full collection.
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestSoak runs 1,000 rounds on 4 ranks (goroutines over the in-process
// transport), each round with a new random layout (dtypes and shapes of
// every tensor drawn again, so the receivers' models reallocate what
// changed), and checks that every receiver holds every byte of every
// round, that every round commits, and that the heap in use at round 1,000
// is within 10% of round 10's (both rounds carry the same layout, so the
// live data is the same). It takes a while under -race: it runs only with
// WEIGHTCAST_SOAK=1 (make soak).
func TestSoak(t *testing.T) {
	if testing.Short() || os.Getenv("WEIGHTCAST_SOAK") == "" {
		t.Skip("the soak test runs with WEIGHTCAST_SOAK=1 (make soak)")
	}
	rounds := 1000
	if n, err := strconv.Atoi(os.Getenv("WEIGHTCAST_SOAK_ROUNDS")); err == nil && n >= 20 {
		rounds = n
	}
	const (
		bucket = 64 << 10
		names  = 24
		mark   = 10 // the round the memory is first measured at
	)
	g := newGroup(t, groupOpts{world: 4, bucket: bucket, checksum: true})
	models := []*memModel{newMemModel(), newMemModel(), newShadowModel()}
	sinks := []Sink{models[0], models[1], models[2]}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	start := time.Now()
	var prev tensorList
	var base, end, peak uint64
	var baseGoroutines int
	var bytesMoved, reallocs int64
	for round := 1; round <= rounds; round++ {
		seed := uint64(round)
		if round == mark || round == rounds {
			seed = 0 // the reference layout
		}
		src := soakLayout(seed, names, bucket)
		allocsBefore := models[0].Allocations()
		if err := g.round(ctx, src, uint64(round), sinks); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i, m := range models {
			if c := g.receivers[i].Committed(); c != uint64(round) {
				t.Fatalf("round %d: rank %d committed %d", round, i+1, c)
			}
			if m.Version() != uint64(round) || len(m.Names()) != names {
				t.Fatalf("round %d: rank %d serves version %d with %d tensors", round, i+1, m.Version(), len(m.Names()))
			}
			for _, want := range src {
				got, ok := m.Get(want.Name)
				if !ok || got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
					t.Fatalf("round %d: rank %d: tensor %s differs from the source", round, i+1, want.Name)
				}
				bytesMoved += int64(len(want.Data))
			}
		}
		// The in-place model reallocated exactly the tensors whose
		// dtype or shape changed.
		changed := 0
		for i, tn := range src {
			if prev == nil || prev[i].DType != tn.DType || !slices.Equal(prev[i].Shape, tn.Shape) {
				changed++
			}
		}
		if got := models[0].Allocations() - allocsBefore; got != changed {
			t.Fatalf("round %d: %d tensors changed dtype or shape, the model reallocated %d", round, changed, got)
		}
		reallocs += int64(changed)
		prev = src
		// Measured at the same point of rounds carrying the same layout,
		// with the same data live: the models and this round's source.
		switch {
		case round == mark:
			base, baseGoroutines = heapInuse(), runtime.NumGoroutine()
			peak = base
		case round == rounds:
			end = heapInuse()
			peak = max(peak, end)
		case round > mark && round%100 == 0:
			peak = max(peak, heapInuse())
		}
		runtime.KeepAlive(src)
	}
	runtime.KeepAlive(models)
	t.Logf("%d rounds in %v: %d MiB verified on 3 receivers, %d tensors reallocated; heap in use %d KiB at round %d, %d KiB at round %d (%+.1f%%), peak %d KiB; goroutines %d then %d",
		rounds, time.Since(start).Round(time.Millisecond), bytesMoved>>20, reallocs, base>>10, mark, end>>10, rounds,
		100*(float64(end)-float64(base))/float64(base), peak>>10, baseGoroutines, runtime.NumGoroutine())
	if float64(end) > 1.1*float64(base) || float64(end) < 0.9*float64(base) {
		t.Errorf("heap in use went from %d KiB at round %d to %d KiB at round %d: more than 10%%", base>>10, mark, end>>10, rounds)
	}
	if n := runtime.NumGoroutine(); n > baseGoroutines {
		t.Errorf("%d goroutines at round %d, %d at round %d", baseGoroutines, mark, n, rounds)
	}
	for r, p := range g.pools {
		if p.Held() != 0 || p.MaxHeld() > DefaultBuffers {
			t.Errorf("rank %d: %d buffers held, at most %d", r, p.Held(), p.MaxHeld())
		}
	}
}
