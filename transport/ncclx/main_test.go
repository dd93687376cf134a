package ncclx

import (
	"testing"

	"github.com/weightcast/weightcast/gpu/gputest"
)

// Tests that run rank 1 as a child process (ncclx_gpu_test.go) run this
// test binary again with procs.Env set to its configuration; TestMain hands
// such a process to runChild instead of the tests.
var procs = gputest.Procs[childConfig]{Env: "WEIGHTCAST_NCCLX_TEST_CHILD", Run: runChild}

func TestMain(m *testing.M) { procs.Main(m) }
