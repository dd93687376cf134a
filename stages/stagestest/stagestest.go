// Package stagestest runs whole weight-sync rounds (stages.Sender and
// stages.Receiver) for tests. Rounds runs them over a byte transport and
// the ZeroMQ metadata bus, the root in the test process and every receiver
// in a child process of the test binary: the transport tests' check that
// the pipeline works over them end to end, with each receiver verifying
// every byte it holds. Group runs them with every rank a goroutine of the
// test's process over the inproc transport and bus: the rounds the tests
// of the sinks and sources (packages sink and source) move their bytes
// through.
//
// It sits under stages, not under transport: it imports stages, and
// transport and everything under it import nothing above them (the tests
// of package transport check it). Its own tests run the rounds over every
// built-in transport that has processes for ranks: tcp, ipc and nccl.
package stagestest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
	"github.com/weightcast/weightcast/transport/zmqbus"
)

// Rank is one rank's end of a sync group: a Pool of two buckets on its
// device, its endpoint of a transport, its end of the ZeroMQ bus, and the
// root's Sender or a receiver's Receiver over them.
type Rank struct {
	Pool     *stages.Pool
	Endpoint transport.Endpoint
	Sender   *stages.Sender   // on rank 0
	Receiver *stages.Receiver // on every other rank
	bus      interface{ Close() error }
}

// OpenRank opens cfg.Rank's end of the group: a pool of buckets of bucket
// bytes on cfg.Device, the transport called name, and the bus.
func OpenRank(ctx context.Context, name string, cfg transport.Config, bucket int) (*Rank, error) {
	pool, err := stages.NewPool(cfg.Device, stages.DefaultBuffers, bucket)
	if err != nil {
		return nil, err
	}
	r := &Rank{Pool: pool}
	if r.Endpoint, err = transport.Open(ctx, name, cfg); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	if cfg.Rank == 0 {
		pub, err := zmqbus.OpenPublisher(ctx, cfg)
		if err != nil {
			return nil, errors.Join(err, r.Close())
		}
		r.bus = pub
		r.Sender = stages.NewSender(stages.SenderConfig{Endpoint: r.Endpoint, Publisher: pub, Pool: pool})
		return r, nil
	}
	sub, err := zmqbus.OpenSubscriber(ctx, cfg)
	if err != nil {
		return nil, errors.Join(err, r.Close())
	}
	r.bus = sub
	r.Receiver = stages.NewReceiver(stages.ReceiverConfig{Endpoint: r.Endpoint, Subscriber: sub, Pool: pool, Rank: cfg.Rank})
	return r, nil
}

// Close closes the Sender or Receiver (the GPU state it keeps between
// rounds), the bus, the endpoint and the pool, in that order.
func (r *Rank) Close() error {
	var errs []error
	if r.Sender != nil {
		errs = append(errs, r.Sender.Close())
	}
	if r.Receiver != nil {
		errs = append(errs, r.Receiver.Close())
	}
	if r.bus != nil {
		errs = append(errs, r.bus.Close())
	}
	if r.Endpoint != nil {
		errs = append(errs, r.Endpoint.Close())
	}
	return errors.Join(append(errs, r.Pool.Close())...)
}

// Model is what a receiver loads rounds into and checks them by: a
// sink.DeviceModel on a GPU, verified by reading it back after a round;
// on the host a sink that verifies every byte as it arrives.
type Model struct {
	dm      *sink.DeviceModel // on a GPU
	vs      *sink.Verifier    // on the host
	want    stages.Lookuper
	checked int64 // the host sink's count at the last Verify
}

// NewModel returns the model of a receiver on d, to be checked against
// want.
func NewModel(d mem.Device, want stages.Lookuper) (*Model, error) {
	if cd, ok := d.(*gpu.CUDADevice); ok {
		dm, err := sink.NewDeviceModel(cd)
		if err != nil {
			return nil, err
		}
		return &Model{dm: dm, want: want}, nil
	}
	return &Model{vs: sink.Verify(want), want: want}, nil
}

// Sink is what Receiver.Sync loads into.
func (m *Model) Sink() stages.Sink {
	if m.dm != nil {
		return m.dm
	}
	return m.vs
}

// Verify checks the round just received against want and returns how many
// bytes it compared: all the model holds on a GPU, what the round brought
// on the host (checked as it arrived).
func (m *Model) Verify(ctx context.Context) (int64, error) {
	if m.dm != nil {
		st, err := m.dm.Verify(ctx, m.want)
		return st.Bytes, err
	}
	n := m.vs.Bytes - m.checked
	m.checked = m.vs.Bytes
	return n, nil
}

// Bytes is the device memory the model holds (0 on the host).
func (m *Model) Bytes() int64 {
	if m.dm != nil {
		return m.dm.Bytes()
	}
	return 0
}

// Close frees the model.
func (m *Model) Close() error {
	if m.dm != nil {
		return m.dm.Close()
	}
	return nil
}

// Rounds is a run of sync rounds of a synthetic model over a transport.
// Declare it as a package variable of the transport's tests and hand it to
// transporttest.Main from TestMain (its receivers run from there).
type Rounds struct {
	// Transport is the registry name of the transport; the test binary
	// imports its package.
	Transport string
	// Memory is where every rank's buckets and model live.
	Memory transporttest.Memory
	// DevicePerRank places rank r on device r; otherwise every rank is
	// on device 0.
	DevicePerRank bool
	World         int
	Model         source.Synthetic
	Bucket        int
	Rounds        int
	// Timeout bounds each wait of the transport and the bus; 0 means 60 s.
	Timeout time.Duration
	// BetweenRounds, when set, runs on every rank before every round but
	// the first (the nccl transport's Rebuild).
	BetweenRounds func(ctx context.Context, ep transport.Endpoint) error
	// Name tells apart the Rounds of one test binary (their child
	// processes); it may stay empty where there is one.
	Name string
	// DeviceSource has the root send the model from device tensors, each
	// in an allocation of its own on its GPU (a trainer's weights), where
	// otherwise it sends the synthetic model's host bytes.
	DeviceSource bool
}

// Report is what one rank of a run says about its device memory.
type Report struct {
	Rank    int
	Ordinal int
	// FreeDrop is how far the device's free memory fell between the
	// moment every rank had its device open and the end of the rounds
	// (0 where the device does not say: the host). Ranks sharing a
	// device each see every rank's allocations.
	FreeDrop int64
	// Held is what the rank holds by design: its two buckets and the
	// model it received.
	Held int64
	// Direct is, on the root, how many buckets of the last round its
	// receivers read in place in its memory.
	Direct int
}

func (r *Rounds) timeout() time.Duration {
	if r.Timeout > 0 {
		return r.Timeout
	}
	return time.Minute
}

func (r *Rounds) ordinal(rank int) int {
	if r.DevicePerRank {
		return rank
	}
	return 0
}

// limit bounds a whole run on every rank.
func (r *Rounds) limit() time.Duration { return time.Duration(r.Rounds+2) * 2 * r.timeout() }

// child is what a receiver's process is told.
type child struct {
	Group transporttest.Group
	Rank  int
}

func (r *Rounds) procs() transporttest.Procs[child] {
	env := "WEIGHTCAST_STAGESTEST_CHILD"
	if r.Name != "" {
		env += "_" + strings.ToUpper(r.Name)
	}
	return transporttest.Procs[child]{Env: env, Run: func(c child) error {
		ctx, cancel := context.WithTimeout(context.Background(), r.limit())
		defer cancel()
		return r.play(ctx, c.Group, c.Rank, func(format string, args ...any) { fmt.Printf(format+"\n", args...) })
	}}
}

// PlayChild plays a receiver in a child process that Run started; ok is
// false in any other process.
func (r *Rounds) PlayChild() (code int, ok bool) { return r.procs().PlayChild() }

// Run runs the rounds, skipping t where the memory or its devices are
// missing, and failing it where any rank fails; it returns every rank's
// report, by rank.
func (r *Rounds) Run(t *testing.T) []Report {
	t.Helper()
	need := 1
	if r.DevicePerRank {
		need = r.World
	}
	if n := r.Memory.Devices(t); n < need {
		t.Skipf("skipping: needs %d %s devices; found %d", need, r.Memory.Name(), n)
	}
	g := transporttest.NewGroup(t, "rounds-"+r.Transport)
	kids := make([]*transporttest.Child, r.World)
	for rank := 1; rank < r.World; rank++ {
		kids[rank] = r.procs().Start(t, rank, child{Group: g, Rank: rank})
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.limit())
	defer cancel()
	if err := r.play(ctx, g, 0, t.Logf); err != nil {
		t.Fatalf("rank 0: %v", err)
	}
	for _, k := range kids[1:] {
		k.Wait(t, time.Minute)
	}
	reports := make([]Report, r.World)
	x := g.Exchange(0)
	for rank := range reports {
		raw, err := x.Get(ctx, rank, "report")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &reports[rank]); err != nil {
			t.Fatalf("rank %d's report %q: %v", rank, raw, err)
		}
	}
	return reports
}

// play is one rank of the run. Every rank opens its device and waits for
// the others to have theirs before it reads the device's free memory;
// after the rounds it reads it again, publishes its report, and keeps
// everything until every rank has read. It logs each round with logf.
func (r *Rounds) play(ctx context.Context, g transporttest.Group, rank int, logf func(format string, args ...any)) (err error) {
	d, err := r.Memory.Open(r.ordinal(rank))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Close()) }()
	x := g.Exchange(rank)
	free0, err := freeMemory(ctx, x, d, "setup", r.World)
	if err != nil {
		return err
	}
	want, err := r.Model.Model()
	if err != nil {
		return err
	}
	rk, err := OpenRank(ctx, r.Transport, g.Config(rank, r.World, d.Mem(), r.timeout()), r.Bucket)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rk.Close()) }()
	var m *Model
	if rk.Receiver != nil {
		if m, err = NewModel(d.Mem(), want); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, m.Close()) }()
	}
	var src stages.Source = want
	if rk.Sender != nil && r.DeviceSource {
		ts, free, err := onDevice(ctx, d.Mem(), want)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, free()) }()
		src = ts
	}
	direct := 0
	for v := uint64(1); v <= uint64(r.Rounds); v++ {
		if v > 1 && r.BetweenRounds != nil {
			if err := r.BetweenRounds(ctx, rk.Endpoint); err != nil {
				return fmt.Errorf("before round %d: %w", v, err)
			}
		}
		if direct, err = r.round(ctx, rk, rank, v, src, want, m, logf); err != nil {
			return fmt.Errorf("round %d: %w", v, err)
		}
	}
	held := int64(2 * r.Bucket)
	if m != nil {
		held += m.Bytes()
	}
	free1, err := freeMemory(ctx, x, d, "", 0)
	if err != nil {
		return err
	}
	rep, _ := json.Marshal(Report{Rank: rank, Ordinal: r.ordinal(rank), FreeDrop: int64(free0) - int64(free1), Held: held, Direct: direct})
	if err := x.Put(ctx, "report", rep); err != nil {
		return err
	}
	return x.Barrier(ctx, "measured", r.World)
}

// round sends round v of src (want's tensors) from the root, or receives
// it into m on a receiver and verifies it against want. On the root it
// returns how many buckets the receivers read in place.
func (r *Rounds) round(ctx context.Context, rk *Rank, rank int, v uint64, src stages.Source, want *source.SyntheticModel, m *Model, logf func(string, ...any)) (int, error) {
	if rk.Sender != nil {
		st, err := rk.Sender.Sync(ctx, src, v)
		if err == nil {
			logf("rank 0 round %d: %d bytes in %d buckets (%d read in place) in %v", v, st.Bytes, st.Buckets, st.Direct, st.Duration.Round(time.Millisecond))
		}
		return st.Direct, err
	}
	st, err := rk.Receiver.Sync(ctx, m.Sink())
	if err != nil {
		return 0, err
	}
	n, err := m.Verify(ctx)
	if err != nil {
		return 0, err
	}
	if st.Version != v || n != want.Size() {
		return 0, fmt.Errorf("committed version %d, verified %d of %d bytes", st.Version, n, want.Size())
	}
	logf("rank %d round %d: %d bytes verified", rank, v, n)
	return 0, nil
}

// onDevice uploads want's tensors to dev, a GPU, each into an allocation
// of its own, and returns them as device tensors with the function that
// frees them.
func onDevice(ctx context.Context, dev mem.Device, want *source.SyntheticModel) (source.Tensors, func() error, error) {
	cd, ok := dev.(*gpu.CUDADevice)
	if !ok {
		return nil, nil, fmt.Errorf("a device source needs a GPU, not %s", dev.Name())
	}
	s, err := cd.NewStream()
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	var bufs []mem.Buffer
	free := func() error {
		var errs []error
		for _, b := range bufs {
			errs = append(errs, b.Free())
		}
		return errors.Join(errs...)
	}
	var ts source.Tensors
	for _, t := range want.List() {
		n, err := t.Size()
		if err != nil {
			return nil, nil, errors.Join(err, free())
		}
		b, err := cd.Alloc(int(max(n, 1)))
		if err != nil {
			return nil, nil, errors.Join(err, free())
		}
		bufs = append(bufs, b)
		data := make([]byte, n)
		if err := t.ReadAt(data, 0); err != nil {
			return nil, nil, errors.Join(err, free())
		}
		if err := s.CopyHtoD(b, 0, data); err != nil {
			return nil, nil, errors.Join(err, free())
		}
		ts = append(ts, &stages.Tensor{Name: t.Name, DType: t.DType, Shape: t.Shape, Device: b})
	}
	if err := s.Sync(ctx); err != nil {
		return nil, nil, errors.Join(err, free())
	}
	return ts, free, nil
}

// memInfoer is a device that tells its free and total memory, as a
// *gpu.CUDADevice does.
type memInfoer interface {
	MemInfo() (free, total uint64, err error)
}

// freeMemory returns d's free memory where the device tells (a GPU), and 0
// elsewhere. With a barrier name it first waits until world ranks have
// their devices open, and after reading until they all have read.
func freeMemory(ctx context.Context, x transporttest.FileExchange, d transporttest.Device, barrier string, world int) (uint64, error) {
	if barrier != "" {
		if err := x.Barrier(ctx, barrier+".open", world); err != nil {
			return 0, err
		}
	}
	var free uint64
	if m, ok := d.Mem().(memInfoer); ok {
		var err error
		if free, _, err = m.MemInfo(); err != nil {
			return 0, err
		}
	}
	if barrier != "" {
		return free, x.Barrier(ctx, barrier+".read", world)
	}
	return free, nil
}
