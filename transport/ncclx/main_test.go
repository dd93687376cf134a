package ncclx

import (
	"testing"

	"github.com/weightcast/weightcast/nccl/nccltest"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// conformance is the transport suite for nccl: GPU memory, one GPU per
// rank (NCCL refuses two ranks on one), ranks as goroutines of one process
// and as processes, 64 MiB buckets (more than NCCL buffers between two
// ranks, so that a root whose peer is gone blocks). It is a collective:
// see transporttest.Suite.Collective.
var conformance = &transporttest.Suite{
	Name: Name, Open: Open, Memory: nccltest.Memory{},
	Ranks:         transporttest.Goroutines | transporttest.Processes,
	DevicePerRank: true, Collective: true, MaxBucket: 64 << 20,
}

// procs runs rank 1 of this package's benchmarks (runChild).
var procs = transporttest.Procs[childConfig]{Env: "WEIGHTCAST_NCCLX_TEST_CHILD", Run: runChild}

// TestMain hands child processes to the suite or runChild. Whole rounds
// over nccl are stages/stagestest's tests.
func TestMain(m *testing.M) { transporttest.Main(m, conformance, procs) }
