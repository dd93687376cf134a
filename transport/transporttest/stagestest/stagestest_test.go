package stagestest

import (
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport/tcp"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// overTCP is three rounds over tcp between four processes, in host memory:
// tensors larger than a bucket, mixed dtypes.
var overTCP = &Rounds{
	Transport: tcp.Name, Memory: transporttest.HostMemory{}, World: 4,
	Model:  stages.Synthetic{Size: 6 << 20, Tensors: 9, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 5},
	Bucket: 512 << 10, Rounds: 3,
}

func TestMain(m *testing.M) { transporttest.Main(m, overTCP) }

// TestRoundsOverTCP runs the rounds; every receiver verifies every byte of
// each round (Run fails otherwise) and every rank reports what it held.
func TestRoundsOverTCP(t *testing.T) {
	reports := overTCP.Run(t)
	for r, rep := range reports {
		if rep.Rank != r || rep.Held != 1<<20 || rep.FreeDrop != 0 {
			t.Errorf("rank %d reported %+v; want two 512 KiB buckets held and no device memory", r, rep)
		}
	}
}
