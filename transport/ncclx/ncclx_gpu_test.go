package ncclx

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/nccl"
	"github.com/weightcast/weightcast/nccl/nccltest"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// The tests and benchmarks below need 2 GPUs and NCCL (two NCCL ranks
// cannot share one GPU); they skip, saying why, elsewhere. Rank 0 runs in
// the test process on cuda:0, rank 1 in a child process on cuda:1.

const (
	// benchBucket is the bucket size of the benchmark.
	benchBucket = 1 << 30
	// benchWarm broadcasts run before the timer starts.
	benchWarm = 2
)

// childConfig tells the child process what rank 1 does: Count broadcasts
// of benchBucket bytes through the transport ("transport") or a plain
// communicator ("raw"). Whole pipeline rounds over nccl, and their
// benchmark (BenchmarkNCCLPipeline), are stages/stagestest's.
type childConfig struct {
	Mode  string
	Group transporttest.Group
	Count int
}

// startPair starts rank 1 of a new group (prefix-<pid>) in a child process
// with cfg, after skipping where the benchmark cannot run, and sets rank 0
// up here: cuda:0 and its transport configuration, and a context that ends
// after limit or with the benchmark.
func startPair(b *testing.B, prefix string, cfg childConfig, limit time.Duration) (context.Context, *gpu.CUDADevice, transport.Config, *transporttest.Child) {
	b.Helper()
	gputest.SkipWithoutCUDA(b, "2 CUDA GPUs")
	gputest.SkipWithoutDevices(b, 2, " (NCCL refuses two ranks on one GPU)")
	nccltest.SkipWithout(b)
	cfg.Group = transporttest.NewGroup(b, prefix)
	kid := procs.Start(b, 1, cfg)
	d := gputest.Open(b, 0)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	b.Cleanup(cancel)
	return ctx, d, cfg.Group.Config(0, 2, d, time.Minute), kid
}

// wait fails b unless the child exits cleanly within a minute.
func wait(b *testing.B, kid *transporttest.Child) {
	if err := kid.Exit(time.Minute); err != nil {
		b.Fatalf("rank 1: %v\n%s", err, kid.Output())
	}
}

// BenchmarkNCCLBroadcast broadcasts 1 GiB buckets from cuda:0 to cuda:1,
// alternating two buffers, through the transport and through a plain loop
// of nccl.Comm.Broadcast over the same kind of buffers; the ratio of the
// two GB/s figures is the transport's overhead (the target is at least
// 0.95).
func BenchmarkNCCLBroadcast(b *testing.B) {
	for _, via := range []string{"transport", "raw"} {
		b.Run(via, func(b *testing.B) {
			ctx, d, cfg, kid := startPair(b, "nccl-bw", childConfig{Mode: via, Count: benchWarm + b.N}, 5*time.Minute)
			bufs := []mem.Buffer{gputest.Alloc(b, d, benchBucket), gputest.Alloc(b, d, benchBucket)}
			bcast, closeComm, err := broadcaster(ctx, via, cfg, d)
			if err != nil {
				b.Fatal(err)
			}
			for i := range benchWarm + b.N {
				if i == benchWarm {
					b.ResetTimer()
				}
				if err := bcast(i, bufs[i%2]); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)*benchBucket/b.Elapsed().Seconds()/1e9, "GB/s")
			// Close while the peer is alive: finalizing may wait for it.
			if err := closeComm(); err != nil {
				b.Error(err)
			}
			wait(b, kid)
		})
	}
}

// broadcaster returns a broadcast of bucket i from buf on this rank,
// through an endpoint of the transport or through a communicator of its own
// (unique id under "raw.uid"), and a function that closes it.
func broadcaster(ctx context.Context, via string, cfg transport.Config, d *gpu.CUDADevice) (func(i int, buf mem.Buffer) error, func() error, error) {
	if via == "transport" {
		ep, err := Open(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return func(i int, buf mem.Buffer) error { return ep.Broadcast(ctx, uint64(i), buf, benchBucket) }, ep.Close, nil
	}
	var id nccl.UniqueID
	if cfg.Rank == 0 {
		var err error
		if id, err = nccl.NewUniqueID(); err != nil {
			return nil, nil, err
		}
		if err := cfg.Exchange.Put(ctx, "raw.uid", id[:]); err != nil {
			return nil, nil, err
		}
	} else {
		raw, err := cfg.Exchange.Get(ctx, 0, "raw.uid")
		if err != nil {
			return nil, nil, err
		}
		copy(id[:], raw)
	}
	c, err := nccl.NewComm(ctx, nccl.Config{Device: d, ID: id, NRanks: 2, Rank: cfg.Rank, Label: "raw"})
	if err != nil {
		return nil, nil, err
	}
	s, err := d.NewStream()
	if err != nil {
		c.Abort()
		return nil, nil, err
	}
	var once sync.Once
	var cerr error
	closeComm := func() error {
		once.Do(func() {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cerr = c.Close(cctx)
			s.Close()
		})
		return cerr
	}
	return func(i int, buf mem.Buffer) error {
		p := buf.DevicePtr()
		return c.Broadcast(ctx, p, p, benchBucket, 0, s)
	}, closeComm, nil
}

// runChild plays rank 1 on cuda:1.
func runChild(cfg childConfig) error {
	return gputest.OnDevice(1, 10*time.Minute, func(ctx context.Context, d *gpu.CUDADevice) error {
		tc := cfg.Group.Config(1, 2, d, time.Minute)
		bufs := make([]mem.Buffer, 2)
		for i := range bufs {
			b, err := d.Alloc(benchBucket)
			if err != nil {
				return err
			}
			defer b.Free()
			bufs[i] = b
		}
		bcast, closeComm, err := broadcaster(ctx, cfg.Mode, tc, d)
		if err != nil {
			return err
		}
		defer closeComm()
		for i := range cfg.Count {
			if err := bcast(i, bufs[i%2]); err != nil {
				return err
			}
		}
		return closeComm()
	})
}

// TestPairsConformance runs the point-to-point suite on nccl's pairs, the
// senders on cuda:0 and the receivers on cuda:1 (a pair's two ranks on
// two GPUs), as goroutines of this process. It needs two GPUs.
func TestPairsConformance(t *testing.T) {
	(&transporttest.PairsSuite{Name: Name, Open: Descriptor.OpenPairs, Memory: gputest.CUDAMemory{}, MinDevices: 2,
		Ordinal: func(rank, senders int) int {
			if rank < senders {
				return 0
			}
			return 1
		}}).Run(t)
}
