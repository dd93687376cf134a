package ncclx

// Tests that run ranks as child processes use transporttest's harness: the
// test binary runs itself again with childEnv set, and TestMain hands such a
// process to runChild instead of the tests.

import (
	"testing"

	"github.com/weightcast/weightcast/transport/transporttest"
)

const childEnv = "WEIGHTCAST_NCCLX_TEST_CHILD"

type fileExchange = transporttest.FileExchange

func startChild(t *testing.T, rank int, cfg any) *transporttest.Child {
	t.Helper()
	return transporttest.StartChild(t, childEnv, nil, rank, cfg)
}
