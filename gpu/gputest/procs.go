package gputest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// Procs is the plumbing of a package whose tests run ranks as child
// processes: the test binary runs itself again with Env set to a rank's
// configuration (JSON), and the package's TestMain, Procs.Main, hands such
// a process to Run instead of running the tests.
type Procs struct {
	// Env names the environment variable that carries a child's
	// configuration; one per package (WEIGHTCAST_<PKG>_TEST_CHILD).
	Env string
	// Run plays a child's rank with the configuration and returns the
	// process's exit code.
	Run func(cfg string) int
}

// Main is a package's TestMain: in a child process it exits with what Run
// returns; otherwise it runs the tests under goleak.
func (p Procs) Main(m *testing.M) {
	if cfg := os.Getenv(p.Env); cfg != "" {
		os.Exit(p.Run(cfg))
	}
	goleak.VerifyTestMain(m)
}

// Start runs rank in a child process with cfg (NCCL_NVLS_ENABLE=0 set); the
// test's cleanup kills it if it still runs and waits for it.
func (p Procs) Start(t *testing.T, rank int, cfg any) *transporttest.Child {
	t.Helper()
	return transporttest.StartChild(t, p.Env, nil, rank, cfg)
}

// Group is what the processes of one multi-process test share: a group
// name of their own and the directory that their file exchange lives in.
// A child gets it in its configuration (it marshals as JSON).
type Group struct {
	Name string
	Dir  string
}

// NewGroup names a group prefix-<pid>, with a temporary directory removed
// when t ends.
func NewGroup(t *testing.T, prefix string) Group {
	return Group{Name: fmt.Sprintf("%s-%d", prefix, os.Getpid()), Dir: t.TempDir()}
}

// Exchange is rank's view of the group's file exchange.
func (g Group) Exchange(rank int) transporttest.FileExchange {
	return transporttest.FileExchange{Dir: g.Dir, Rank: rank}
}

// Config is rank's transport configuration in a world of world ranks, its
// buffers on d, each wait bounded by timeout.
func (g Group) Config(rank, world int, d gpu.Device, timeout time.Duration) transport.Config {
	return transport.Config{Group: g.Name, Rank: rank, WorldSize: world, Device: d, Exchange: g.Exchange(rank), Timeout: timeout}
}
