package stagestest

import (
	"context"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/nccl/nccltest"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/ipc"
	"github.com/weightcast/weightcast/transport/ncclx"
	"github.com/weightcast/weightcast/transport/tcp"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// overTCP is three rounds over tcp between four processes, in host memory:
// tensors larger than a bucket, mixed dtypes.
var overTCP = &Rounds{
	Name: "tcp", Transport: tcp.Name, Memory: transporttest.HostMemory{}, World: 4,
	Model:  source.Synthetic{Size: 6 << 20, Tensors: 9, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 5},
	Bucket: 512 << 10, Rounds: 3,
}

// overIPC is the whole pipeline over ipc: four processes on one GPU, a
// synthetic model with tensors larger than a bucket and mixed dtypes,
// received into DeviceModels, two rounds.
var overIPC = &Rounds{
	Name: "ipc", Transport: ipc.Name, Memory: gputest.CUDAMemory{}, World: 4,
	Model:  source.Synthetic{Size: 48 << 20, Tensors: 12, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 11},
	Bucket: 8 << 20, Rounds: 2, Timeout: 30 * time.Second,
}

// directIPC is overIPC with the model on the root's GPU, each tensor in
// an allocation of its own: every receiver shares the root's GPU, so they
// read the tensors in place, mapping each allocation by its handle.
var directIPC = &Rounds{
	Name: "direct", Transport: ipc.Name, Memory: gputest.CUDAMemory{}, World: 4, DeviceSource: true,
	Model:  source.Synthetic{Size: 48 << 20, Tensors: 12, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 12},
	Bucket: 8 << 20, Rounds: 2, Timeout: 30 * time.Second,
}

// overNCCL is the whole pipeline over nccl between two processes: a
// synthetic model packed into device buckets on cuda:0, received into a
// DeviceModel on cuda:1, the communicator rebuilt between the rounds.
var overNCCL = &Rounds{
	Name: "nccl", Transport: ncclx.Name, Memory: nccltest.Memory{}, DevicePerRank: true, World: 2,
	Model:  source.Synthetic{Size: 256 << 20, Tensors: 40, DTypes: []dtype.DType{dtype.BF16, dtype.F32, dtype.F16}, Seed: 21},
	Bucket: 32 << 20, Rounds: 2, Timeout: time.Minute,
	BetweenRounds: func(ctx context.Context, ep transport.Endpoint) error { return ep.(*ncclx.Endpoint).Rebuild(ctx) },
}

// TestMain hands child processes to the rounds or to the NCCL pipeline
// benchmark's receiver.
func TestMain(m *testing.M) {
	transporttest.Main(m, overTCP, overIPC, directIPC, overNCCL, pipelineProcs)
}

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
