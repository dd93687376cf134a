package ipc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
	"github.com/weightcast/weightcast/transport/zmqbus"
)

// The tests below need a GPU; they skip, saying why, where CUDA is absent.

// TestIPCInProcess runs a world of 4 in this process (receivers copy from
// the root's address: a process cannot open its own handles): random
// sizes, each root bucket fenced behind its own upload, byte-identical.
func TestIPCInProcess(t *testing.T) {
	d := gputest.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const world, size = 4, 4 << 20
	cfgs := transporttest.Configs(t.Name(), world, 20*time.Second)
	for r := range cfgs {
		cfgs[r].Device = d
	}
	eps := transporttest.OpenAll(t, ctx, Open, cfgs)
	bufs := make([]mem.Buffer, world)
	for r := range bufs {
		bufs[r] = gputest.Alloc(t, d, size)
	}
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 7, 4096, 1 << 20, size}
	for range 10 {
		sizes = append(sizes, rng.IntN(size))
	}
	for seq, n := range sizes {
		want := gputest.RandomBytes(rng, n)
		gputest.Upload(t, s, bufs[0], 0, want)
		ev, err := s.Record()
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, world)
		for r := range world {
			buf := bufs[r]
			if r == 0 {
				buf = gpu.WithFence(buf, ev)
			}
			wg.Go(func() { errs[r] = eps[r].Broadcast(ctx, uint64(seq), buf, n) })
		}
		wg.Wait()
		ev.Close()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("bucket %d (%d bytes): %v", seq, n, err)
		}
		for r := 1; r < world; r++ {
			if got := gputest.Download(t, s, bufs[r], 0, n); !bytes.Equal(got, want) {
				t.Fatalf("bucket %d: rank %d received different bytes", seq, r)
			}
		}
	}
	host, _ := mem.Host{}.Alloc(16)
	if err := eps[0].Broadcast(ctx, 99, host, 16); err == nil {
		t.Fatal("broadcast of a host buffer succeeded")
	}
}

// childConfig tells a child process which rank to play.
type childConfig struct {
	Mode   string // "stages" or "raw"
	Group  gputest.Group
	Rank   int
	World  int
	Device int
	Bucket int
	// raw mode: Count broadcasts of Size bytes (Count < 0: until failure);
	// byte 0 of bucket seq must be Fill[seq%2].
	Count int
	Size  int
	Fill  [2]byte
}

// The synthetic model of the multi-process test: tensors larger than a
// bucket, mixed dtypes.
var procModel = stages.Synthetic{Size: 48 << 20, Tensors: 12, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 11}

const procBucket = 8 << 20

// memReport is what each rank publishes about its GPU memory.
type memReport struct {
	Device     int   `json:"device"`
	Used       int64 `json:"used"`        // free memory before setup minus after the rounds, on its GPU
	ModelBytes int64 `json:"model_bytes"` // what its DeviceModel holds
}

// TestIPCProcesses runs the whole pipeline across 4 processes: this one is
// the root (synthetic model → device buckets → ipc, metadata over the
// ZeroMQ bus) and three children receive into DeviceModels and verify every
// byte, over two rounds, all on one GPU. Each rank's GPU memory (the driver's free figure, measured when every context
// exists) must grow by its two buckets and the model it holds, plus at
// most a small allowance for the transport and streams.
func TestIPCProcesses(t *testing.T) {
	gputest.SkipWithoutCUDA(t, "a CUDA GPU")
	const world = 4
	g, kids := startReceivers(t, "ipc-proc", world, childConfig{Mode: "stages", Bucket: procBucket})
	d := gputest.Open(t, 0)
	x := g.Exchange(0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	free0, err := memBarrier(ctx, x, d, "setup", world)
	if err != nil {
		t.Fatal(err)
	}
	cfg := g.Config(0, world, d, 30*time.Second)
	pool, err := stages.NewPool(d, stages.DefaultBuffers, procBucket)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ep, err := transport.Open(ctx, Name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	pub, err := zmqbus.OpenPublisher(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	m, err := procModel.Model()
	if err != nil {
		t.Fatal(err)
	}
	snd := stages.NewSender(stages.SenderConfig{Endpoint: ep, Publisher: pub, Pool: pool})
	for v := uint64(1); v <= 2; v++ {
		st, err := snd.Sync(ctx, m, v)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d bytes in %d buckets in %v", v, st.Bytes, st.Buckets, st.Duration.Round(time.Millisecond))
	}
	free1, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Put(ctx, "mem", mustJSON(memReport{Device: 0, Used: int64(free0) - int64(free1)})); err != nil {
		t.Fatal(err)
	}
	if err := x.Barrier(ctx, "measured", world); err != nil {
		t.Fatal(err)
	}
	// On each GPU, what the ranks there allocated beyond their two
	// buckets and their model.
	used := map[int]int64{}
	expect := map[int]int64{}
	ranks := map[int]int{}
	for r := range world {
		raw, err := x.Get(ctx, r, "mem")
		if err != nil {
			t.Fatal(err)
		}
		var rep memReport
		json.Unmarshal(raw, &rep)
		used[rep.Device] = max(used[rep.Device], rep.Used) // ranks of one GPU see one figure
		expect[rep.Device] += 2*procBucket + rep.ModelBytes
		ranks[rep.Device]++
	}
	const allowance = 64 << 20 // per rank: streams, IPC mappings, driver pools
	for dev, u := range used {
		extra := u - expect[dev]
		t.Logf("cuda:%d: %d ranks; free memory fell by %.1f MiB: two buckets of %d MiB and the model per rank account for %.1f MiB, leaving %.1f MiB per rank",
			dev, ranks[dev], float64(u)/(1<<20), procBucket>>20, float64(expect[dev])/(1<<20), float64(extra)/float64(ranks[dev])/(1<<20))
		if extra > int64(ranks[dev])*allowance {
			t.Errorf("cuda:%d: %.1f MiB per rank beyond two buckets and the model; want at most %d MiB", dev, float64(extra)/float64(ranks[dev])/(1<<20), allowance>>20)
		}
	}
	for r := 1; r < world; r++ {
		kids[r].Wait(t, time.Minute)
	}
}

// memBarrier waits until every rank has its CUDA context, reads the free
// memory, and waits until every rank has read it.
func memBarrier(ctx context.Context, x transporttest.FileExchange, d *gpu.CUDADevice, name string, world int) (uint64, error) {
	if err := x.Barrier(ctx, name+".contexts", world); err != nil {
		return 0, err
	}
	free, _, err := d.MemInfo()
	if err != nil {
		return 0, err
	}
	return free, x.Barrier(ctx, name+".measured", world)
}

// startReceivers starts ranks 1 to world-1 of a new group (prefix-<pid>)
// in child processes, each with cfg but for its group, rank and world;
// kids[r] is rank r's process.
func startReceivers(t *testing.T, prefix string, world int, cfg childConfig) (g gputest.Group, kids []*transporttest.Child) {
	t.Helper()
	g = gputest.NewGroup(t, prefix)
	kids = make([]*transporttest.Child, world)
	for r := 1; r < world; r++ {
		cfg.Group, cfg.Rank, cfg.World = g, r, world
		kids[r] = procs.Start(t, r, cfg)
	}
	return g, kids
}

// rootBuffers allocates the root's two buffers of size bytes on d, every
// byte of buffer i set to fill[i]: a raw-mode receiver checks which one
// each bucket came from.
func rootBuffers(t *testing.T, d *gpu.CUDADevice, size int, fill [2]byte) []mem.Buffer {
	t.Helper()
	s := gputest.Stream(t, d)
	bufs := make([]mem.Buffer, len(fill))
	for i, v := range fill {
		bufs[i] = gputest.Alloc(t, d, size)
		gputest.Fill(t, s, bufs[i], v)
	}
	return bufs
}

// rootEndpoint opens rank 0 of g (world ranks) on d, each wait bounded by
// timeout, and closes it when t ends.
func rootEndpoint(t *testing.T, ctx context.Context, g gputest.Group, world int, d *gpu.CUDADevice, timeout time.Duration) transport.Endpoint {
	t.Helper()
	ep, err := Open(ctx, g.Config(0, world, d, timeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	return ep
}

// sendBuckets broadcasts count buckets of size bytes from bufs in turn and
// returns how long those after the first warm took.
func sendBuckets(t *testing.T, ctx context.Context, ep transport.Endpoint, bufs []mem.Buffer, size, warm, count int) time.Duration {
	t.Helper()
	var start time.Time
	for seq := range count {
		if seq == warm {
			start = time.Now()
		}
		if err := ep.Broadcast(ctx, uint64(seq), bufs[seq%len(bufs)], size); err != nil {
			t.Fatal(err)
		}
	}
	return time.Since(start)
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestIPCReceiverKilled kills a receiver process with SIGKILL between two
// buckets: the root's next broadcast must fail with ErrPeerGone naming it,
// well within the wait bound.
func TestIPCReceiverKilled(t *testing.T) {
	gputest.SkipWithoutCUDA(t, "a CUDA GPU")
	const world, size = 3, 1 << 20
	fill := [2]byte{0xA1, 0xB2}
	g, kids := startReceivers(t, "ipc-kill", world, childConfig{Mode: "raw", Count: -1, Size: size, Fill: fill})
	d := gputest.Open(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const bound = 10 * time.Second
	bufs := rootBuffers(t, d, size, fill)
	ep := rootEndpoint(t, ctx, g, world, d, bound)
	if err := ep.Broadcast(ctx, 0, bufs[0], size); err != nil {
		t.Fatal(err)
	}
	kids[1].Kill()
	start := time.Now()
	err := ep.Broadcast(ctx, 1, bufs[1], size)
	took := time.Since(start)
	var te *transport.Error
	if err == nil || !errors.As(err, &te) || !errors.Is(err, transport.ErrPeerGone) || te.Peer != 1 {
		t.Fatalf("broadcast after rank 1 was killed: %v; want a *transport.Error for peer 1 wrapping ErrPeerGone", err)
	}
	if took > bound {
		t.Fatalf("the root noticed the dead receiver after %v, past the %v bound", took, bound)
	}
	t.Logf("root failed in %v: %v", took.Round(time.Microsecond), err)
	ep.Close()
	kids[2].Kill()
}

// TestIPCCrossGPU sends buckets from the root on cuda:0 to a receiver
// process on cuda:1, which maps the root's buffers from its own context
// (peer access) and checks each bucket's source; it reports GB/s.
func TestIPCCrossGPU(t *testing.T) {
	gputest.SkipWithoutCUDA(t, "a CUDA GPU")
	gputest.SkipWithoutDevices(t, 2, " on the host")
	const size, count = 256 << 20, 12
	fill := [2]byte{0x5C, 0xC5}
	g, kids := startReceivers(t, "ipc-peer", 2, childConfig{Mode: "raw", Device: 1, Count: count, Size: size, Fill: fill})
	d := gputest.Open(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bufs := rootBuffers(t, d, size, fill)
	ep := rootEndpoint(t, ctx, g, 2, d, 30*time.Second)
	el := sendBuckets(t, ctx, ep, bufs, size, 2, count)
	t.Logf("ipc cuda:0 → cuda:1, %d MiB buckets: %.1f GB/s", size>>20, float64(count-2)*size/el.Seconds()/1e9)
	kids[1].Wait(t, time.Minute)
}

// TestIPCThroughput moves 256 MiB buckets from the root to 3 receiver
// processes on the same GPU and reports GB/s per receiver (bytes landed in
// each receiver's buffer per second) and in all. Receivers check that each
// bucket came from the right one of the root's two buffers.
func TestIPCThroughput(t *testing.T) {
	gputest.SkipWithoutCUDA(t, "a CUDA GPU")
	const world, size, warm, timed = 4, 256 << 20, 4, 32
	fill := [2]byte{0x11, 0x22}
	g, kids := startReceivers(t, "ipc-bw", world, childConfig{Mode: "raw", Count: warm + timed, Size: size, Fill: fill})
	d := gputest.Open(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bufs := rootBuffers(t, d, size, fill)
	ep := rootEndpoint(t, ctx, g, world, d, 30*time.Second)
	el := sendBuckets(t, ctx, ep, bufs, size, warm, warm+timed)
	per := float64(timed) * size / el.Seconds() / 1e9
	t.Logf("ipc 1 root → %d receivers on one GPU, %d MiB buckets: %.1f GB/s per receiver, %.1f GB/s in all (%d buckets in %v, %.0f µs per bucket)",
		world-1, size>>20, per, per*float64(world-1), timed, el.Round(time.Microsecond), float64(el.Microseconds())/timed)
	for r := 1; r < world; r++ {
		kids[r].Wait(t, time.Minute)
	}
}

// runChild plays one receiver rank on cuda:cfg.Device.
func runChild(cfg childConfig) error {
	return gputest.OnDevice(cfg.Device, 2*time.Minute, func(ctx context.Context, d *gpu.CUDADevice) error {
		switch cfg.Mode {
		case "stages":
			return childStages(ctx, cfg, d)
		case "raw":
			return childRaw(ctx, cfg, d)
		}
		return fmt.Errorf("unknown mode %q", cfg.Mode)
	})
}

func childStages(ctx context.Context, cfg childConfig, d *gpu.CUDADevice) (err error) {
	x := cfg.Group.Exchange(cfg.Rank)
	free0, err := memBarrier(ctx, x, d, "setup", cfg.World)
	if err != nil {
		return err
	}
	tc := cfg.Group.Config(cfg.Rank, cfg.World, d, 30*time.Second)
	pool, err := stages.NewPool(d, stages.DefaultBuffers, cfg.Bucket)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, pool.Close()) }()
	ep, err := transport.Open(ctx, Name, tc)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, ep.Close()) }()
	sub, err := zmqbus.OpenSubscriber(ctx, tc)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sub.Close()) }()
	dm, err := stages.NewDeviceModel(d)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, dm.Close()) }()
	m, err := procModel.Model()
	if err != nil {
		return err
	}
	rcv := stages.NewReceiver(stages.ReceiverConfig{Endpoint: ep, Subscriber: sub, Pool: pool, Rank: cfg.Rank})
	for v := uint64(1); v <= 2; v++ {
		st, err := rcv.Sync(ctx, dm)
		if err != nil {
			return err
		}
		vs, err := dm.Verify(ctx, m)
		if err != nil {
			return fmt.Errorf("round %d: %w", v, err)
		}
		if st.Version != v || vs.Bytes != m.Size() {
			return fmt.Errorf("round %d: committed version %d, verified %d of %d bytes", v, st.Version, vs.Bytes, m.Size())
		}
		fmt.Printf("rank %d round %d: %d bytes verified on cuda:%d\n", cfg.Rank, v, vs.Bytes, cfg.Device)
	}
	free1, _, err := d.MemInfo()
	if err != nil {
		return err
	}
	if err := x.Put(ctx, "mem", mustJSON(memReport{Device: cfg.Device, Used: int64(free0) - int64(free1), ModelBytes: dm.Bytes()})); err != nil {
		return err
	}
	return x.Barrier(ctx, "measured", cfg.World)
}

func childRaw(ctx context.Context, cfg childConfig, d *gpu.CUDADevice) error {
	tc := cfg.Group.Config(cfg.Rank, cfg.World, d, time.Minute)
	ep, err := Open(ctx, tc)
	if err != nil {
		return err
	}
	defer ep.Close()
	buf, err := d.Alloc(cfg.Size)
	if err != nil {
		return err
	}
	defer buf.Free()
	s, err := d.NewStream()
	if err != nil {
		return err
	}
	defer s.Close()
	for seq := 0; cfg.Count < 0 || seq < cfg.Count; seq++ {
		if err := ep.Broadcast(ctx, uint64(seq), buf, cfg.Size); err != nil {
			return err
		}
		var b [1]byte
		if err := s.CopyDtoH(b[:], buf, cfg.Size-1); err != nil {
			return err
		}
		if err := s.Sync(ctx); err != nil {
			return err
		}
		if b[0] != cfg.Fill[seq%2] {
			return fmt.Errorf("bucket %d ends with %#x, want %#x: copied from the wrong buffer", seq, b[0], cfg.Fill[seq%2])
		}
		fmt.Printf("rank %d: bucket %d\n", cfg.Rank, seq)
	}
	return nil
}
