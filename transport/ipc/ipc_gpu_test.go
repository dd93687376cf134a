package ipc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// The tests below need a GPU; they skip, saying why, where CUDA is absent.

// TestConformance runs the transport suite (see conformance).
func TestConformance(t *testing.T) { conformance.Run(t) }

// childConfig tells a child process which receiver to play: Count
// broadcasts of Size bytes into a buffer on cuda:Device, checking that
// bucket seq came from the root's buffer seq%2 (each filled with Fill[i]).
type childConfig struct {
	Group  transporttest.Group
	Rank   int
	World  int
	Device int
	Count  int
	Size   int
	Fill   [2]byte
}

// startReceivers starts ranks 1 to world-1 of a new group (prefix-<pid>)
// in child processes, each with cfg but for its group, rank and world.
func startReceivers(t *testing.T, prefix string, world int, cfg childConfig) (transporttest.Group, []*transporttest.Child) {
	t.Helper()
	g := transporttest.NewGroup(t, prefix)
	kids := make([]*transporttest.Child, world)
	for r := 1; r < world; r++ {
		cfg.Group, cfg.Rank, cfg.World = g, r, world
		kids[r] = procs.Start(t, r, cfg)
	}
	return g, kids
}

// rootSide opens cuda:0, the root's two buffers of size bytes (buffer i
// filled with fill[i]) and rank 0's endpoint of g, all closed when tb ends.
func rootSide(tb testing.TB, ctx context.Context, g transporttest.Group, world, size int, fill [2]byte) (transport.Endpoint, []mem.Buffer) {
	tb.Helper()
	d := gputest.Device(tb)
	s := gputest.Stream(tb, d)
	bufs := make([]mem.Buffer, len(fill))
	for i, v := range fill {
		bufs[i] = gputest.Alloc(tb, d, size)
		gputest.Fill(tb, s, bufs[i], v)
	}
	ep, err := Open(ctx, g.Config(0, world, d, 30*time.Second))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ep.Close() })
	return ep, bufs
}

// TestIPCCrossGPU sends buckets from the root on cuda:0 to a receiver
// process on cuda:1, which maps the root's buffers from its own context
// (peer access) and checks that each bucket came from the right one.
func TestIPCCrossGPU(t *testing.T) {
	gputest.SkipWithoutCUDA(t, "a CUDA GPU")
	gputest.SkipWithoutDevices(t, 2, " on the host")
	const size, count = 64 << 20, 12
	fill := [2]byte{0x5C, 0xC5}
	g, kids := startReceivers(t, "ipc-peer", 2, childConfig{Device: 1, Count: count, Size: size, Fill: fill})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ep, bufs := rootSide(t, ctx, g, 2, size, fill)
	if ep.(transport.DirectReader).ReadsDirect() {
		t.Fatal("a receiver on another GPU counts as reading the root's memory in place")
	}
	for seq := range count {
		if err := ep.Broadcast(ctx, uint64(seq), bufs[seq%2], size); err != nil {
			t.Fatal(err)
		}
	}
	kids[1].Wait(t, time.Minute)
}

// TestIPCReadsDirect checks that a root whose receivers are processes on
// its own GPU says they read its memory in place (each sent the GPU's
// UUID in its hello).
func TestIPCReadsDirect(t *testing.T) {
	gputest.SkipWithoutCUDA(t, "a CUDA GPU")
	const size = 1 << 20
	fill := [2]byte{1, 2}
	g, kids := startReceivers(t, "ipc-direct", 3, childConfig{Device: 0, Count: 2, Size: size, Fill: fill})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ep, bufs := rootSide(t, ctx, g, 3, size, fill)
	if !ep.(transport.DirectReader).ReadsDirect() {
		t.Fatal("receivers on the root's GPU do not count as reading its memory in place")
	}
	for seq := range 2 {
		if err := ep.Broadcast(ctx, uint64(seq), bufs[seq%2], size); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range kids[1:] {
		k.Wait(t, time.Minute)
	}
}

// BenchmarkIPC moves 256 MiB buckets from the root on cuda:0 to receiver
// processes, each checking that every bucket came from the right one of
// the root's two buffers: three receivers on the same GPU (colocated
// ranks), and one on cuda:1. It reports GB/s landed per receiver, and in
// all.
func BenchmarkIPC(b *testing.B) {
	for _, c := range []struct {
		name          string
		world, device int
	}{
		{"same-gpu/3-receivers", 4, 0},
		{"cuda0-to-cuda1", 2, 1},
	} {
		b.Run(c.name, func(b *testing.B) { benchIPC(b, c.world, c.device) })
	}
}

func benchIPC(b *testing.B, world, device int) {
	gputest.SkipWithoutCUDA(b, "a CUDA GPU")
	gputest.SkipWithoutDevices(b, device+1, "")
	const size, warm = 256 << 20, 4
	fill := [2]byte{0x11, 0x22}
	g := transporttest.NewGroup(b, "ipc-bench")
	kids := make([]*transporttest.Child, world)
	for r := 1; r < world; r++ {
		kids[r] = procs.Start(b, r, childConfig{Group: g, Rank: r, World: world, Device: device, Count: warm + b.N, Size: size, Fill: fill})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ep, bufs := rootSide(b, ctx, g, world, size, fill)
	for seq := range warm + b.N {
		if seq == warm {
			b.ResetTimer()
		}
		if err := ep.Broadcast(ctx, uint64(seq), bufs[seq%2], size); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	per := float64(b.N) * size / b.Elapsed().Seconds() / 1e9
	b.ReportMetric(per, "GB/s/receiver")
	b.ReportMetric(per*float64(world-1), "GB/s")
	for _, k := range kids[1:] {
		if err := k.Exit(time.Minute); err != nil {
			b.Fatalf("%v\n%s", err, k.Output())
		}
	}
}

// runChild plays one receiver on cuda:cfg.Device.
func runChild(cfg childConfig) error {
	return gputest.OnDevice(cfg.Device, 5*time.Minute, func(ctx context.Context, d *gpu.CUDADevice) error {
		ep, err := Open(ctx, cfg.Group.Config(cfg.Rank, cfg.World, d, time.Minute))
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
		for seq := range cfg.Count {
			if err := ep.Broadcast(ctx, uint64(seq), buf, cfg.Size); err != nil {
				return err
			}
			var last [1]byte
			if err := s.CopyDtoH(last[:], buf, cfg.Size-1); err != nil {
				return err
			}
			if err := s.Sync(ctx); err != nil {
				return err
			}
			if last[0] != cfg.Fill[seq%2] {
				return fmt.Errorf("bucket %d ends with %#x, want %#x: copied from the wrong buffer", seq, last[0], cfg.Fill[seq%2])
			}
		}
		return nil
	})
}

// TestIPCLend runs checkLend on a GPU.
func TestIPCLend(t *testing.T) {
	gputest.SkipWithoutCUDA(t, "a CUDA GPU")
	checkLend(t, gputest.Device(t))
}

// TestPairsConformance runs the point-to-point suite on ipc's pairs, every
// rank on cuda:0 as goroutines of this process.
func TestPairsConformance(t *testing.T) {
	(&transporttest.PairsSuite{Name: Name, Open: Descriptor.OpenPairs, Memory: gputest.CUDAMemory{}}).Run(t)
}
