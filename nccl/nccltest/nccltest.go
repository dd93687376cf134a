package nccltest

import (
	"errors"
	"testing"

	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/nccl"
)

// Memory is GPU memory on a host that has NCCL too: where the library is
// missing, Devices skips the test, saying so.
type Memory struct{ gputest.CUDAMemory }

// Devices counts the GPUs (gputest.CUDAMemory.Devices), then skips the
// test where NCCL cannot be loaded.
func (m Memory) Devices(tb testing.TB) int {
	tb.Helper()
	n := m.CUDAMemory.Devices(tb)
	SkipWithout(tb)
	return n
}

// SkipWithout skips the test where NCCL's library is missing, and fails
// it where the library is there but does not load.
func SkipWithout(tb testing.TB) {
	tb.Helper()
	if err := nccl.Load(nccl.Options{}); errors.Is(err, nccl.ErrNoLibrary) {
		tb.Skipf("skipping: needs NCCL: %v", err)
	} else if err != nil {
		tb.Fatal(err)
	}
}
