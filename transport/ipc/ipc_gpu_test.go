package ipc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
	"github.com/weightcast/weightcast/transport/zmqbus"
)

// The tests below need a GPU; they skip, saying why, where CUDA is absent.

func skipWithoutCUDA(tb testing.TB) {
	tb.Helper()
	err := gpu.OpenCUDA()
	if errors.Is(err, gpu.ErrNoDriver) || errors.Is(err, gpu.ErrNoDevice) {
		tb.Skipf("skipping: needs a CUDA GPU: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
}

func openDevice(tb testing.TB, ordinal int) *gpu.CUDADevice {
	tb.Helper()
	d, err := gpu.NewCUDADevice(ordinal)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

func mustAlloc(tb testing.TB, d gpu.Device, n int) gpu.Buffer {
	tb.Helper()
	b, err := d.Alloc(n)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { b.Free() })
	return b
}

func mustStream(tb testing.TB, d *gpu.CUDADevice) *gpu.Stream {
	tb.Helper()
	s, err := d.NewStream()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// TestIPCInProcess runs a world of 4 in this process (receivers copy from
// the root's address: a process cannot open its own handles): random
// sizes, each root bucket fenced behind its own upload, byte-identical.
func TestIPCInProcess(t *testing.T) {
	skipWithoutCUDA(t)
	d := openDevice(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const world, size = 4, 4 << 20
	cfgs := transporttest.Configs(t.Name(), world, 20*time.Second)
	for r := range cfgs {
		cfgs[r].Device = d
	}
	eps := transporttest.OpenAll(t, ctx, Open, cfgs)
	bufs := make([]gpu.Buffer, world)
	for r := range bufs {
		bufs[r] = mustAlloc(t, d, size)
	}
	s := mustStream(t, d)
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 7, 4096, 1 << 20, size}
	for range 10 {
		sizes = append(sizes, rng.IntN(size))
	}
	for seq, n := range sizes {
		want := make([]byte, n)
		for i := range want {
			want[i] = byte(rng.Uint32())
		}
		if err := s.CopyHtoD(bufs[0], 0, want); err != nil {
			t.Fatal(err)
		}
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
			got := make([]byte, n)
			if err := s.CopyDtoH(got, bufs[r], 0); err != nil {
				t.Fatal(err)
			}
			if err := s.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("bucket %d: rank %d received different bytes", seq, r)
			}
		}
	}
	host, _ := gpu.Host{}.Alloc(16)
	if err := eps[0].Broadcast(ctx, 99, host, 16); err == nil {
		t.Fatal("broadcast of a host buffer succeeded")
	}
}

// childConfig tells a child process which rank to play.
type childConfig struct {
	Mode   string // "stages" or "raw"
	Dir    string // the file exchange
	Group  string
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
	skipWithoutCUDA(t)
	dir := t.TempDir()
	group := fmt.Sprintf("ipc-proc-%d", os.Getpid())
	const world = 4
	kids := make([]*transporttest.Child, world)
	for r := 1; r < world; r++ {
		kids[r] = startChild(t, r, childConfig{Mode: "stages", Dir: dir, Group: group, Rank: r, World: world, Bucket: procBucket})
	}
	d := openDevice(t, 0)
	x := fileExchange{Dir: dir, Rank: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	free0 := memBarrier(t, ctx, x, d, "setup", world)
	cfg := transport.Config{Group: group, Rank: 0, WorldSize: world, Device: d, Exchange: x, Timeout: 30 * time.Second}
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
func memBarrier(t *testing.T, ctx context.Context, x fileExchange, d *gpu.CUDADevice, name string, world int) uint64 {
	t.Helper()
	if err := x.Barrier(ctx, name+".contexts", world); err != nil {
		t.Fatal(err)
	}
	free, _, err := d.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Barrier(ctx, name+".measured", world); err != nil {
		t.Fatal(err)
	}
	return free
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// TestIPCReceiverKilled kills a receiver process with SIGKILL between two
// buckets: the root's next broadcast must fail with ErrPeerGone naming it,
// well within the wait bound.
func TestIPCReceiverKilled(t *testing.T) {
	skipWithoutCUDA(t)
	dir := t.TempDir()
	group := fmt.Sprintf("ipc-kill-%d", os.Getpid())
	const world, size = 3, 1 << 20
	kids := make([]*transporttest.Child, world)
	for r := 1; r < world; r++ {
		kids[r] = startChild(t, r, childConfig{Mode: "raw", Dir: dir, Group: group, Rank: r, World: world, Count: -1, Size: size, Fill: [2]byte{0xA1, 0xB2}})
	}
	d := openDevice(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const bound = 10 * time.Second
	ep, err := Open(ctx, transport.Config{Group: group, Rank: 0, WorldSize: world, Device: d, Exchange: fileExchange{Dir: dir}, Timeout: bound})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	bufs := []gpu.Buffer{mustAlloc(t, d, size), mustAlloc(t, d, size)}
	s := mustStream(t, d)
	for i, v := range []byte{0xA1, 0xB2} {
		s.Memset(bufs[i], 0, size, v)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ep.Broadcast(ctx, 0, bufs[0], size); err != nil {
		t.Fatal(err)
	}
	kids[1].Kill()
	start := time.Now()
	err = ep.Broadcast(ctx, 1, bufs[1], size)
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
	skipWithoutCUDA(t)
	if n, _ := gpu.DeviceCount(); n < 2 {
		t.Skipf("skipping: needs 2 GPUs on the host, found %d", n)
	}
	dir := t.TempDir()
	group := fmt.Sprintf("ipc-peer-%d", os.Getpid())
	const size, count = 256 << 20, 12
	kid := startChild(t, 1, childConfig{Mode: "raw", Dir: dir, Group: group, Rank: 1, World: 2, Device: 1, Count: count, Size: size, Fill: [2]byte{0x5C, 0xC5}})
	d := openDevice(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ep, err := Open(ctx, transport.Config{Group: group, Rank: 0, WorldSize: 2, Device: d, Exchange: fileExchange{Dir: dir}, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	bufs := []gpu.Buffer{mustAlloc(t, d, size), mustAlloc(t, d, size)}
	s := mustStream(t, d)
	s.Memset(bufs[0], 0, size, 0x5C)
	s.Memset(bufs[1], 0, size, 0xC5)
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var start time.Time
	for seq := range count {
		if seq == 2 {
			start = time.Now()
		}
		if err := ep.Broadcast(ctx, uint64(seq), bufs[seq%2], size); err != nil {
			t.Fatal(err)
		}
	}
	el := time.Since(start)
	t.Logf("ipc cuda:0 → cuda:1, %d MiB buckets: %.1f GB/s", size>>20, float64(count-2)*size/el.Seconds()/1e9)
	kid.Wait(t, time.Minute)
}

// TestIPCThroughput moves 256 MiB buckets from the root to 3 receiver
// processes on the same GPU and reports GB/s per receiver (bytes landed in
// each receiver's buffer per second) and in all. Receivers check that each
// bucket came from the right one of the root's two buffers.
func TestIPCThroughput(t *testing.T) {
	skipWithoutCUDA(t)
	dir := t.TempDir()
	group := fmt.Sprintf("ipc-bw-%d", os.Getpid())
	const world, size, warm, timed = 4, 256 << 20, 4, 32
	kids := make([]*transporttest.Child, world)
	for r := 1; r < world; r++ {
		kids[r] = startChild(t, r, childConfig{Mode: "raw", Dir: dir, Group: group, Rank: r, World: world, Count: warm + timed, Size: size, Fill: [2]byte{0x11, 0x22}})
	}
	d := openDevice(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ep, err := Open(ctx, transport.Config{Group: group, Rank: 0, WorldSize: world, Device: d, Exchange: fileExchange{Dir: dir}, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	bufs := []gpu.Buffer{mustAlloc(t, d, size), mustAlloc(t, d, size)}
	s := mustStream(t, d)
	s.Memset(bufs[0], 0, size, 0x11)
	s.Memset(bufs[1], 0, size, 0x22)
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var start time.Time
	for seq := range warm + timed {
		if seq == warm {
			start = time.Now()
		}
		if err := ep.Broadcast(ctx, uint64(seq), bufs[seq%2], size); err != nil {
			t.Fatal(err)
		}
	}
	el := time.Since(start)
	per := float64(timed) * size / el.Seconds() / 1e9
	t.Logf("ipc 1 root → %d receivers on one GPU, %d MiB buckets: %.1f GB/s per receiver, %.1f GB/s in all (%d buckets in %v, %.0f µs per bucket)",
		world-1, size>>20, per, per*float64(world-1), timed, el.Round(time.Microsecond), float64(el.Microseconds())/timed)
	for r := 1; r < world; r++ {
		kids[r].Wait(t, time.Minute)
	}
}

// runChild plays one receiver rank and returns the process's exit code.
func runChild(js string) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bad child config:", err)
		return 2
	}
	var err error
	switch cfg.Mode {
	case "stages":
		err = childStages(cfg)
	case "raw":
		err = childRaw(cfg)
	default:
		err = fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", cfg.Rank, err)
		return 1
	}
	fmt.Printf("rank %d: ok\n", cfg.Rank)
	return 0
}

func childStages(cfg childConfig) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := gpu.NewCUDADevice(cfg.Device)
	if err != nil {
		return err
	}
	defer d.Close()
	x := fileExchange{Dir: cfg.Dir, Rank: cfg.Rank}
	if err := x.Barrier(ctx, "setup.contexts", cfg.World); err != nil {
		return err
	}
	free0, _, err := d.MemInfo()
	if err != nil {
		return err
	}
	if err := x.Barrier(ctx, "setup.measured", cfg.World); err != nil {
		return err
	}
	tc := transport.Config{Group: cfg.Group, Rank: cfg.Rank, WorldSize: cfg.World, Device: d, Exchange: x, Timeout: 30 * time.Second}
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

func childRaw(cfg childConfig) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d, err := gpu.NewCUDADevice(cfg.Device)
	if err != nil {
		return err
	}
	defer d.Close()
	tc := transport.Config{Group: cfg.Group, Rank: cfg.Rank, WorldSize: cfg.World, Device: d, Exchange: fileExchange{Dir: cfg.Dir, Rank: cfg.Rank}, Timeout: time.Minute}
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
