package ipc

import (
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport/transporttest"
	"github.com/weightcast/weightcast/transport/transporttest/stagestest"
)

// conformance is the transport suite for ipc: GPU memory, every rank on
// cuda:0 (colocated ranks share a GPU), as goroutines of one process
// (receivers then copy from the root's address: a process cannot open its
// own handles) and as processes.
var conformance = &transporttest.Suite{
	Name: Name, Open: Open, Memory: gputest.CUDAMemory{},
	Ranks: transporttest.Goroutines | transporttest.Processes,
}

// rounds is the whole pipeline over ipc: four processes on one GPU, a
// synthetic model with tensors larger than a bucket and mixed dtypes,
// received into DeviceModels, two rounds.
var rounds = &stagestest.Rounds{
	Transport: Name, Memory: gputest.CUDAMemory{}, World: 4,
	Model:  stages.Synthetic{Size: 48 << 20, Tensors: 12, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 11},
	Bucket: 8 << 20, Rounds: 2, Timeout: 30 * time.Second,
}

// directRounds is rounds with the model on the root's GPU, each tensor in
// an allocation of its own: every receiver shares the root's GPU, so they
// read the tensors in place, mapping each allocation by its handle.
var directRounds = &stagestest.Rounds{
	Name: "direct", Transport: Name, Memory: gputest.CUDAMemory{}, World: 4, DeviceSource: true,
	Model:  stages.Synthetic{Size: 48 << 20, Tensors: 12, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 12},
	Bucket: 8 << 20, Rounds: 2, Timeout: 30 * time.Second,
}

// procs runs the receivers of this package's own multi-process tests and
// benchmarks (runChild).
var procs = transporttest.Procs[childConfig]{Env: "WEIGHTCAST_IPC_TEST_CHILD", Run: runChild}

// TestMain hands child processes to the suite, the rounds or runChild.
func TestMain(m *testing.M) { transporttest.Main(m, conformance, rounds, directRounds, procs) }
