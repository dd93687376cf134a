package transporttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/transport"
)

// Suite is the byte-transport conformance suite, set for one transport by
// what it can do. Declare it as a package variable of the transport's
// tests, hand it to Main from TestMain (ranks in child processes play from
// there), and call Run from a test:
//
//	var conformance = &transporttest.Suite{Name: Name, Open: Open,
//		Memory: transporttest.HostMemory{}, Ranks: transporttest.Goroutines | transporttest.Processes}
//
//	func TestMain(m *testing.M)        { transporttest.Main(m, conformance) }
//	func TestConformance(t *testing.T) { conformance.Run(t) }
//
// Every case runs each rank's part on its own goroutine or process: buckets
// from 0 bytes to MaxBucket in two rounds of one sequence, through two
// buffers per rank as a Pool hands them out, with every receiver checking
// every byte and that the 64 KiB past the bucket did not change; lengths
// outside the buffer refused; Close idempotent and final; a cancelled root
// and a cancelled receiver; a root and a receiver whose peer stays silent,
// which must time out at the wait bound, not before and not long after,
// naming that peer; and a receiver that goes away after the first bucket
// (closing its endpoint, or killed with SIGKILL), which must fail the root
// with transport.ErrPeerGone naming it, and leave no rank hanging. Every
// failure must be a *transport.Error naming the group, the rank and the
// bucket.
type Suite struct {
	// Name is the name the transport registers; the suite checks that it
	// is registered, and for a built-in that transport.BuiltinPackage
	// names the package of Open.
	Name string
	// Open opens one rank's endpoint: the transport package's Open.
	Open transport.Opener
	// Memory is where the ranks' buffers live: HostMemory, or package
	// gputest's CUDAMemory for transports that move device buffers.
	Memory Memory
	// Ranks says how the ranks of a group run: Goroutines, Processes, or
	// both (each case runs both ways).
	Ranks Ranks
	// Worlds lists the world sizes of the cases that take several; nil
	// means 2 and 4.
	Worlds []int
	// DevicePerRank places rank r on device r (NCCL refuses two ranks on
	// one GPU); otherwise every rank is on device 0. Cases that need more
	// devices than there are skip.
	DevicePerRank bool
	// Collective marks a transport whose ranks only meet in a collective
	// call, as NCCL's do: its errors need not name the rank at fault, a
	// receiver that goes away is noticed when the wait bound ends (its
	// cases use a short bound), the root may finish a broadcast into its
	// peers' buffers before they call Broadcast (its failure cases try up
	// to four buckets), and Close is collective (no rank leaves by Close
	// while the others broadcast).
	Collective bool
	// MaxBucket is the largest bucket, and the size of each rank's two
	// buffers; 0 means 4 MiB + 3.
	MaxBucket int
	// Options are every rank's transport options.
	Options map[string]string
}

// Ranks says how the suite runs the ranks of a group.
type Ranks int

const (
	// Goroutines runs every rank on a goroutine of the test process.
	Goroutines Ranks = 1 << iota
	// Processes runs rank 0 in the test process and every other rank in
	// a child process of the test binary (see Main).
	Processes
)

// String names the way of running: "goroutines" or "processes".
func (r Ranks) String() string {
	switch r {
	case Goroutines:
		return "goroutines"
	case Processes:
		return "processes"
	}
	return fmt.Sprintf("Ranks(%d)", int(r))
}

func (s *Suite) maxBucket() int {
	if s.MaxBucket > 0 {
		return s.MaxBucket
	}
	return 4<<20 + 3
}

func (s *Suite) worlds() []int {
	if len(s.Worlds) > 0 {
		return s.Worlds
	}
	return []int{2, 4}
}

// ordinal is the device rank r uses.
func (s *Suite) ordinal(r int) int {
	if s.DevicePerRank {
		return r
	}
	return 0
}

// Run runs every case, each way the suite's Ranks allow, for every world
// size it takes, as subtests named case/ranks/world=n. Where the memory is
// absent (no GPU) it skips all but the registration check, saying why once;
// a case that needs more devices than there are skips, saying so.
func (s *Suite) Run(t *testing.T) {
	t.Run("Registered", s.testRegistered)
	devices := s.Memory.Devices(t)
	for _, c := range scenarios {
		t.Run(c.name, func(t *testing.T) {
			worlds := s.worlds()
			if c.world > 0 {
				worlds = []int{c.world}
			}
			for _, ranks := range []Ranks{Goroutines, Processes} {
				if s.Ranks&ranks == 0 {
					continue
				}
				for _, world := range worlds {
					t.Run(fmt.Sprintf("%v/world=%d", ranks, world), func(t *testing.T) { s.runCase(t, c, ranks, world, devices) })
				}
			}
		})
	}
}

func (s *Suite) testRegistered(t *testing.T) {
	if err := s.registration(); err != nil {
		t.Fatal(err)
	}
}

// registration returns why the transport is not registered under its
// name, or, for a built-in, why "unknown transport" would not name the
// package that registers it; nil where neither.
func (s *Suite) registration() error {
	if !slices.Contains(transport.Names(), s.Name) {
		return fmt.Errorf("transport %q is not registered; registered: %v", s.Name, transport.Names())
	}
	pkg := transport.BuiltinPackage(s.Name)
	if got := funcPackage(s.Open); pkg != "" && got != pkg {
		return fmt.Errorf("transport.BuiltinPackage(%q) = %q, but the package of its Open is %q", s.Name, pkg, got)
	}
	return nil
}

// funcPackage returns the import path of the package that declares f.
func funcPackage(f any) string {
	name := runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name() // path/to/pkg.Func
	slash := strings.LastIndex(name, "/")
	dot := strings.Index(name[slash+1:], ".")
	if dot < 0 {
		return name
	}
	return name[:slash+1+dot]
}

func (s *Suite) runCase(t *testing.T, c *scenario, ranks Ranks, world, devices int) {
	if s.DevicePerRank && devices < world {
		t.Skipf("skipping: needs %d %s devices, one per rank; found %d", world, s.Memory.Name(), devices)
	}
	if c.departs && ranks == Goroutines && s.Collective {
		t.Skip("skipping: a rank of a collective transport cannot leave by Close while the others broadcast (its Close is collective too); the processes case kills one")
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.limit)
	defer cancel()
	var err error
	if ranks == Goroutines {
		err = s.goroutines(ctx, t.Name(), c, world)
	} else {
		err = s.processes(t, ctx, c, world)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// goroutines runs case c with every rank of a world on a goroutine of this
// process and returns every rank's failure.
func (s *Suite) goroutines(ctx context.Context, group string, c *scenario, world int) error {
	cfgs := Configs(group, world, c.waitBound(s))
	devs := make([]Device, world)
	defer func() {
		for _, d := range devs {
			if d != nil {
				d.Close()
			}
		}
	}()
	for r := range cfgs {
		d, err := s.Memory.Open(s.ordinal(r))
		if err != nil {
			return fmt.Errorf("rank %d: opening %s device %d: %w", r, s.Memory.Name(), s.ordinal(r), err)
		}
		devs[r] = d
		cfgs[r].Device, cfgs[r].Options = d.Mem(), s.Options
	}
	eps, err := openAll(ctx, s.Open, cfgs)
	if err != nil {
		return err
	}
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			errs[r] = s.play(ctx, c, &rank{cfg: cfgs[r], suite: s, ep: eps[r], dev: devs[r], depart: func() { eps[r].Close() }})
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// processes runs case c with rank 0 in this process and every other rank
// of a world in a child process, and returns every rank's failure (the
// test logs the children's output when it fails).
func (s *Suite) processes(t *testing.T, ctx context.Context, c *scenario, world int) error {
	g := NewGroup(t, fmt.Sprintf("%s-%d", c.name, world))
	kids := make([]*Child, world)
	for r := 1; r < world; r++ {
		kids[r] = s.procs().Start(t, r, rankConfig{Case: c.name, Group: g, Rank: r, World: world})
	}
	if err := s.playRank(ctx, c, g, 0, world, nil); err != nil {
		for _, k := range kids[1:] {
			if k.Exit(5*time.Second) != nil {
				k.Kill() // a child failing on its own has had time to say why
			}
		}
		return err
	}
	var errs []error
	for r := 1; r < world; r++ {
		err := kids[r].Exit(time.Until(deadline(ctx)) + 10*time.Second)
		switch {
		case c.departs && r == leaver(world):
			if !killed(err) {
				errs = append(errs, fmt.Errorf("rank %d was to kill itself after bucket 0; it ended with %v", r, err))
			}
		case err != nil:
			errs = append(errs, fmt.Errorf("rank %d (child process): %v", r, err))
		}
	}
	return errors.Join(errs...)
}

func deadline(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// rankConfig tells a child process which rank of which case to play.
type rankConfig struct {
	Case  string
	Group Group
	Rank  int
	World int
}

func (s *Suite) procs() Procs[rankConfig] {
	return Procs[rankConfig]{Env: "WEIGHTCAST_TRANSPORTTEST_CHILD", Run: s.playChild}
}

// PlayChild plays a rank of a case in a child process that the suite
// started; ok is false in any other process. Main calls it.
func (s *Suite) PlayChild() (code int, ok bool) { return s.procs().PlayChild() }

func (s *Suite) playChild(cfg rankConfig) error {
	c := scenarioNamed(cfg.Case)
	if c == nil {
		return fmt.Errorf("no case %q in the suite", cfg.Case)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.limit)
	defer cancel()
	return s.playRank(ctx, c, cfg.Group, cfg.Rank, cfg.World, killSelf)
}

// killSelf ends this process as a crash would: SIGKILL, no cleanup.
func killSelf() {
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Minute) // the signal is on its way
}

// playRank opens rank id's device and endpoint in g and plays its part of
// c; depart is how it leaves the group in case c (nil on rank 0).
func (s *Suite) playRank(ctx context.Context, c *scenario, g Group, id, world int, depart func()) error {
	d, err := s.Memory.Open(s.ordinal(id))
	if err != nil {
		return fmt.Errorf("rank %d: opening %s device %d: %w", id, s.Memory.Name(), s.ordinal(id), err)
	}
	defer d.Close()
	cfg := g.Config(id, world, d.Mem(), c.waitBound(s))
	cfg.Options = s.Options
	// Every process has started before any opens: the wait bound of Open
	// (1 s in some cases) is for the transport, not for starting a test
	// binary on a loaded machine.
	if err := Barrier(ctx, cfg.Exchange, "started", world); err != nil {
		return fmt.Errorf("rank %d: %w", id, err)
	}
	ep, err := s.Open(ctx, cfg)
	if err != nil {
		return fmt.Errorf("rank %d: open: %w", id, err)
	}
	return s.play(ctx, c, &rank{cfg: cfg, suite: s, ep: ep, dev: d, depart: depart})
}

// play runs r's part of c and closes r's endpoint; a clean case also
// requires Close to succeed.
func (s *Suite) play(ctx context.Context, c *scenario, r *rank) error {
	err := c.play(ctx, r)
	if cerr := r.ep.Close(); cerr != nil && c.clean && err == nil {
		err = fmt.Errorf("Close after the case: %w", cerr)
	}
	if err != nil {
		return fmt.Errorf("rank %d: %w", r.cfg.Rank, err)
	}
	return nil
}

// openAll opens every rank's endpoint concurrently (transports may block
// in Open until all ranks are there); where one fails it closes the others.
func openAll(ctx context.Context, open transport.Opener, cfgs []transport.Config) ([]transport.Endpoint, error) {
	eps := make([]transport.Endpoint, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for r := range cfgs {
		wg.Go(func() { eps[r], errs[r] = open(ctx, cfgs[r]) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, ep := range eps {
			if ep != nil {
				ep.Close()
			}
		}
		return nil, fmt.Errorf("open: %w", err)
	}
	return eps, nil
}
