package ipc

import (
	"testing"

	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// conformance is the transport suite for ipc: GPU memory, every rank on
// cuda:0 (colocated ranks share a GPU), as goroutines of one process
// (receivers then copy from the root's address: a process cannot open its
// own handles) and as processes.
var conformance = &transporttest.Suite{
	Name: Name, Open: Open, Memory: gputest.CUDAMemory{},
	Ranks: transporttest.Goroutines | transporttest.Processes,
}

// procs runs the receivers of this package's own multi-process tests and
// benchmarks (runChild).
var procs = transporttest.Procs[childConfig]{Env: "WEIGHTCAST_IPC_TEST_CHILD", Run: runChild}

// TestMain hands child processes to the suite or runChild. Whole rounds
// over ipc are stages/stagestest's tests.
func TestMain(m *testing.M) { transporttest.Main(m, conformance, procs) }
