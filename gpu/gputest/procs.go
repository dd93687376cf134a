package gputest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// Procs is the plumbing of a package whose tests run ranks as child
// processes: the test binary runs itself again with Env set to a rank's
// configuration, a C as JSON, and the package's TestMain, Procs.Main, hands
// such a process to Run instead of running the tests.
type Procs[C any] struct {
	// Env names the environment variable that carries a child's
	// configuration; one per package (WEIGHTCAST_<PKG>_TEST_CHILD).
	Env string
	// Run plays a child's rank with its configuration.
	Run func(cfg C) error
}

// Main is a package's TestMain. In a child process it decodes the
// configuration, runs Run and exits: 0 after printing "rank <r>: ok", 1
// after printing "rank <r>: <error>" to stderr, 2 where the configuration
// does not decode. Otherwise it runs the tests under goleak.
func (p Procs[C]) Main(m *testing.M) {
	if js := os.Getenv(p.Env); js != "" {
		os.Exit(p.child(js, os.Getenv(p.Env+"_RANK")))
	}
	goleak.VerifyTestMain(m)
}

func (p Procs[C]) child(js, rank string) int {
	var cfg C
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bad child config:", err)
		return 2
	}
	if err := p.Run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "rank %s: %v\n", rank, err)
		return 1
	}
	fmt.Printf("rank %s: ok\n", rank)
	return 0
}

// Start runs rank in a child process with cfg (NCCL_NVLS_ENABLE=0 set); the
// test's cleanup kills it if it still runs and waits for it.
func (p Procs[C]) Start(t *testing.T, rank int, cfg C) *transporttest.Child {
	t.Helper()
	return transporttest.StartChild(t, p.Env, []string{fmt.Sprintf("%s_RANK=%d", p.Env, rank)}, rank, cfg)
}

// OnDevice runs f, the body of a child rank, with cuda:ordinal open and a
// context that ends after limit, and closes the device after it.
func OnDevice(ordinal int, limit time.Duration, f func(ctx context.Context, d *gpu.CUDADevice) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	d, err := gpu.NewCUDADevice(ordinal)
	if err != nil {
		return err
	}
	defer d.Close()
	return f(ctx, d)
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
func (g Group) Config(rank, world int, d mem.Device, timeout time.Duration) transport.Config {
	return transport.Config{Group: g.Name, Rank: rank, WorldSize: world, Device: d, Exchange: g.Exchange(rank), Timeout: timeout}
}
