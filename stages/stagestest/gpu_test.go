package stagestest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/nccl/nccltest"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/ncclx"
	"github.com/weightcast/weightcast/transport/transporttest"
)

// The tests below need a GPU (nccl: 2 GPUs and NCCL); they skip, saying
// why, where those are absent.

// TestIPCRounds runs the whole pipeline across 4 processes on one GPU (see
// overIPC): every receiver verifies every byte of each round. Each GPU's
// free memory, read when every rank's context exists and again after the
// rounds, must fall by no more than every rank's two buckets and the model
// it holds, plus a small allowance per rank for the transport and streams
// (the transport itself allocates no device memory).
func TestIPCRounds(t *testing.T) {
	reports := overIPC.Run(t)
	used, held, ranks := map[int]int64{}, map[int]int64{}, map[int]int{}
	for _, rep := range reports {
		used[rep.Ordinal] = max(used[rep.Ordinal], rep.FreeDrop) // ranks of one GPU see one figure
		held[rep.Ordinal] += rep.Held
		ranks[rep.Ordinal]++
	}
	const allowance = 64 << 20 // per rank: streams, IPC mappings, driver pools
	for dev, u := range used {
		extra := u - held[dev]
		t.Logf("cuda:%d: %d ranks; free memory fell by %.1f MiB, of which buckets and models are %.1f MiB, leaving %.1f MiB per rank",
			dev, ranks[dev], float64(u)/(1<<20), float64(held[dev])/(1<<20), float64(extra)/float64(ranks[dev])/(1<<20))
		if extra > int64(ranks[dev])*allowance {
			t.Errorf("cuda:%d: %.1f MiB per rank beyond two buckets and the model; want at most %d MiB", dev, float64(extra)/float64(ranks[dev])/(1<<20), allowance>>20)
		}
	}
}

// TestIPCDirectRounds runs the whole pipeline across 4 processes on one
// GPU from a model on the root's GPU (see directIPC): every bucket is
// read in place by every receiver, which verifies every byte it holds.
func TestIPCDirectRounds(t *testing.T) {
	reports := directIPC.Run(t)
	if reports[0].Direct == 0 {
		t.Fatal("no bucket was read in place, though every receiver shares the root's GPU")
	}
	t.Logf("%d buckets of the last round read in place", reports[0].Direct)
}

// TestNCCLRounds runs the pipeline over NCCL between two processes (see
// overNCCL): every byte verified on the receiver after each round.
func TestNCCLRounds(t *testing.T) { overNCCL.Run(t) }

const (
	// pipeBucket is the bucket size of BenchmarkNCCLPipeline, and
	// pipeTensors how many of them it moves per round.
	pipeBucket  = 1 << 30
	pipeTensors = 16
)

// pipelineChild tells rank 1 of BenchmarkNCCLPipeline how many rounds to
// receive.
type pipelineChild struct {
	Group transporttest.Group
	Count int
}

// pipelineProcs runs rank 1 of BenchmarkNCCLPipeline on cuda:1.
var pipelineProcs = transporttest.Procs[pipelineChild]{Env: "WEIGHTCAST_STAGESTEST_PIPELINE_CHILD", Run: func(cfg pipelineChild) error {
	return gputest.OnDevice(1, 10*time.Minute, func(ctx context.Context, d *gpu.CUDADevice) error {
		return childPipeline(ctx, cfg.Group.Config(1, 2, d, time.Minute), d, cfg.Count)
	})
}}

// BenchmarkNCCLPipeline runs whole rounds of 16 GiB of bf16 device tensors
// of 1 GiB on cuda:0 through the pipeline over nccl into a DeviceModel on
// cuda:1 (pack, broadcast and the receiver's copy into its model
// overlapped; the warm-up round allocates the model), verified byte for
// byte after the last round; it reports GB/s per round. Compare it with
// transport/ncclx's BenchmarkNCCLBroadcast.
func BenchmarkNCCLPipeline(b *testing.B) {
	gputest.SkipWithoutCUDA(b, "2 CUDA GPUs")
	gputest.SkipWithoutDevices(b, 2, " (NCCL refuses two ranks on one GPU)")
	nccltest.SkipWithout(b)
	g := transporttest.NewGroup(b, "nccl-pipe")
	kid := pipelineProcs.Start(b, 1, pipelineChild{Group: g, Count: 1 + b.N})
	d := gputest.Open(b, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	b.Cleanup(cancel)
	var src source.Tensors
	s := gputest.Stream(b, d)
	for i := range pipeTensors {
		t := gputest.Alloc(b, d, pipeBucket)
		gputest.Fill(b, s, t, byte(i+1))
		src = append(src, &stages.Tensor{Name: tensorName(i), DType: dtype.BF16, Shape: []int64{pipeBucket / 2}, Device: t})
	}
	rk, err := OpenRank(ctx, ncclx.Name, g.Config(0, 2, d, time.Minute), pipeBucket)
	if err != nil {
		b.Fatal(err)
	}
	var bytes int64
	for v := uint64(1); v <= uint64(1+b.N); v++ {
		if v == 2 {
			b.ResetTimer()
		}
		st, err := rk.Sender.Sync(ctx, src, v)
		if err != nil {
			b.Fatal(err)
		}
		bytes = st.Bytes
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)*float64(bytes)/b.Elapsed().Seconds()/1e9, "GB/s")
	// Close while the peer is alive: finalizing may wait for it.
	if err := rk.Close(); err != nil {
		b.Error(err)
	}
	if err := kid.Exit(time.Minute); err != nil {
		b.Fatalf("rank 1: %v\n%s", err, kid.Output())
	}
}

func tensorName(i int) string { return fmt.Sprintf("layers.%d.weight", i) }

// childPipeline receives rounds rounds into a DeviceModel and verifies it
// after the last: tensor i holds byte i+1 throughout.
func childPipeline(ctx context.Context, tc transport.Config, d *gpu.CUDADevice, rounds int) (err error) {
	rk, err := OpenRank(ctx, ncclx.Name, tc, pipeBucket)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, rk.Close()) }()
	want := lookupOf{}
	for i := range pipeTensors {
		want[tensorName(i)] = &stages.Tensor{Name: tensorName(i), DType: dtype.BF16, Shape: []int64{pipeBucket / 2}, Reader: constReader(i + 1)}
	}
	m, err := NewModel(d, want)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, m.Close()) }()
	for range rounds {
		if _, err := rk.Receiver.Sync(ctx, m.Sink()); err != nil {
			return err
		}
	}
	n, err := m.Verify(ctx)
	if err == nil && n != pipeTensors*pipeBucket {
		err = fmt.Errorf("verified %d of %d bytes", n, pipeTensors*pipeBucket)
	}
	return err
}

// constReader reads as n copies of one byte.
type constReader byte

func (c constReader) ReadAt(p []byte, off int64) (int, error) {
	if len(p) > 0 {
		p[0] = byte(c)
		for i := 1; i < len(p); i *= 2 {
			copy(p[i:], p[:i])
		}
	}
	return len(p), nil
}

type lookupOf map[string]*stages.Tensor

func (l lookupOf) Lookup(name string) (*stages.Tensor, bool) { t, ok := l[name]; return t, ok }
