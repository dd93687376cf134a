package ipc

import (
	"testing"

	"github.com/weightcast/weightcast/gpu/gputest"
)

// Tests that run ranks as child processes (ipc_gpu_test.go) run this test
// binary again with procs.Env set to a rank's configuration; TestMain hands
// such a process to runChild instead of the tests.
var procs = gputest.Procs[childConfig]{Env: "WEIGHTCAST_IPC_TEST_CHILD", Run: runChild}

func TestMain(m *testing.M) { procs.Main(m) }
