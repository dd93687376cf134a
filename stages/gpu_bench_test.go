package stages

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/safetensors/safetensorstest"
)

// packRound runs iterate → pack over src with cfg (with pk's state, or the
// stage's own where pk is nil) → a sink that calls each for every bucket,
// then releases it, and returns the round's error. rb copies device
// buckets back to the host for each to use.
func packRound(src Source, cfg PackConfig, pk *Packer, each func(ctx context.Context, rb *gpu.Readback, bk *Bucket) error) error {
	p := pipeline.New("pack round")
	var buckets *pipeline.Stream[*Bucket]
	if pk != nil {
		buckets = pk.Pack(p, Iterate(p, src), cfg)
	} else {
		buckets = Pack(p, Iterate(p, src), cfg)
	}
	pipeline.Sink(p, "each", buckets, func(ctx context.Context, in *pipeline.Input[*Bucket]) (err error) {
		var rb *gpu.Readback
		if bufs := cfg.Pool.Buffers(); cfg.Pool.onDevice() {
			d, err := cudaDeviceOf(bufs[0])
			if err != nil {
				return err
			}
			rb = d.NewReadback()
			defer func() { err = errors.Join(err, rb.Close(ctx)) }()
		}
		for bk := range in.All() {
			err := each(ctx, rb, bk)
			bk.Release()
			if err != nil {
				return err
			}
		}
		return in.Err()
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return p.Run(ctx)
}

// waitFence waits for a device bucket's copies (its fence).
func waitFence(ctx context.Context, _ *gpu.Readback, bk *Bucket) error {
	if ev := gpu.FenceOf(bk.Buf); ev != nil {
		return ev.Wait(ctx)
	}
	return nil
}

// packOnly packs src into buckets from pool with pk's state and waits for
// each bucket's fence: the cost of filling device buckets alone.
func packOnly(b *testing.B, src Source, pool *Pool, pk *Packer) { packSummed(b, src, pool, pk, false) }

// packSummed is packOnly, with each bucket's checksum computed and waited
// for (as Publish waits) when sum is set.
func packSummed(b *testing.B, src Source, pool *Pool, pk *Packer, sum bool) {
	each := waitFence
	if sum {
		each = func(ctx context.Context, rb *gpu.Readback, bk *Bucket) error {
			if bk.sum != nil {
				if _, err := bk.sum.Wait(ctx); err != nil {
					return err
				}
			}
			return waitFence(ctx, rb, bk)
		}
	}
	if err := packRound(src, PackConfig{Pool: pool, Version: 1, Checksum: sum}, pk, each); err != nil {
		b.Fatal(err)
	}
}

// testPacker returns a Packer with plan and staging, closed when tb ends.
func testPacker(tb testing.TB, plan devicePlan, staging gpu.StagingConfig) *Packer {
	pk := newPacker(plan, staging)
	tb.Cleanup(func() {
		if err := pk.Close(); err != nil {
			tb.Error(err)
		}
	})
	return pk
}

// benchPack reports the GB/s of packing src (total bytes) into buckets of
// the given size with plan, after three warm-up rounds (which load the
// kernels and settle the clocks).
func benchPack(b *testing.B, d *gpu.CUDADevice, src Source, total int64, plan devicePlan, bucket int) {
	benchPackSum(b, d, src, total, plan, bucket, false)
}

// benchPackSum is benchPack, with checksums when sum is set: through the
// fused kernel where the plan has the gather kernel, else the plan's
// copies and the checksum kernel after them.
func benchPackSum(b *testing.B, d *gpu.CUDADevice, src Source, total int64, plan devicePlan, bucket int, sum bool) {
	pk := testPacker(b, plan, gpu.DefaultStagingConfig())
	pool := devicePool(b, d, DefaultBuffers, bucket)
	for range 3 {
		packSummed(b, src, pool, pk, sum)
	}
	b.SetBytes(total)
	b.ResetTimer()
	for b.Loop() {
		packSummed(b, src, pool, pk, sum)
	}
	b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	if sum {
		b.Logf("checksum fused into the copies: %v", pk.dev != nil && pk.dev.fuse)
	}
	logPaths(b)
}

// BenchmarkGPUPackDevice packs 1 GiB of device tensors (64 separate
// allocations of 16 MiB, bf16) into 256 MiB device buckets, against one
// plain device-to-device copy of 1 GiB. Both report GB/s of bytes copied.
// "pack" uses Pack's default plan (copies of 16 MiB spread over four copy
// streams); pack-batch and pack-perCopy queue the same copies on one copy
// stream, batched (cuMemcpyBatchAsync) and one cuMemcpyAsync each;
// pack-batch-lanes2 and -lanes4 spread them over two and four streams;
// pack-kernel sends them through the gather kernel; pack-1GiB fills one
// 1 GiB bucket instead of four, so no bucket waits for a free buffer;
// round packs one 64-byte tensor, the fixed cost of a round.
func BenchmarkGPUPackDevice(b *testing.B) {
	d := gputest.Device(b)
	const total, each = 1 << 30, 16 << 20
	src := deviceTensors(b, d, total, each)
	b.Run("plainD2D", func(b *testing.B) { benchPlainD2D(b, d, total) })
	for _, c := range []struct {
		name   string
		plan   devicePlan
		bucket int
	}{
		{"pack", defaultPlan, 256 << 20},
		{"pack-batch", devicePlan{}, 256 << 20},
		{"pack-perCopy", devicePlan{perCopy: true}, 256 << 20},
		{"pack-1GiB", defaultPlan, 1 << 30},
		{"pack-batch-lanes2", devicePlan{lanes: 2, laneAbove: 1 << 20}, 256 << 20},
		{"pack-batch-lanes4", devicePlan{lanes: 4, laneAbove: 1 << 20}, 256 << 20},
		{"pack-kernel", devicePlan{gatherBelow: 64 << 20}, 256 << 20},
	} {
		b.Run(c.name, func(b *testing.B) { benchPack(b, d, src, total, c.plan, c.bucket) })
	}
	// With checksums: the default plan fuses them into the gather
	// kernel's copies; the four-stream plan without the kernel copies on
	// the copy engine and checksums each bucket after.
	b.Run("pack-checksum", func(b *testing.B) { benchPackSum(b, d, src, total, defaultPlan, 256<<20, true) })
	b.Run("pack-checksum-engine", func(b *testing.B) {
		benchPackSum(b, d, src, total, devicePlan{lanes: 4, laneAbove: 16 << 20}, 256<<20, true)
	})
	b.Run("round", func(b *testing.B) {
		pk := testPacker(b, defaultPlan, gpu.DefaultStagingConfig())
		pool := devicePool(b, d, DefaultBuffers, 256<<20)
		one := tensorList{{Name: "w", DType: dtype.U8, Shape: []int64{64}, Device: src[0].Device}}
		packOnly(b, one, pool, pk)
		b.ResetTimer()
		for b.Loop() {
			packOnly(b, one, pool, pk)
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/round")
	})
}

// logPaths says how the last pack queued its device copies.
func logPaths(b *testing.B) {
	gpath, why := gpu.LastGatherPath()
	bpath, failure := gpu.LastBatchPath()
	b.Logf("gather: %v (%v); copy engine: %v (batch failure: %v)", gpath, why, bpath, failure)
}

// BenchmarkGPUPackSmall packs 100,000 device tensors of 4 KiB into 64 MiB
// device buckets and reports the cost per tensor: scattered (every other
// 4 KiB of one buffer, so no two copies merge) and contiguous (back to
// back, so the copies merge), with Pack's default plan (the gather
// kernel), and scattered-batch through the copy engine as before the
// kernel.
func BenchmarkGPUPackSmall(b *testing.B) {
	d := gputest.Device(b)
	const count, size = 100_000, 4 << 10
	buf := gputest.Alloc(b, d, count*2*size)
	for _, layout := range []struct {
		name   string
		stride int64
		plan   devicePlan
	}{{"scattered", 2 * size, defaultPlan}, {"contiguous", size, defaultPlan}, {"scattered-batch", 2 * size, devicePlan{}}} {
		b.Run(layout.name, func(b *testing.B) {
			pk := testPacker(b, layout.plan, gpu.DefaultStagingConfig())
			src := make(tensorList, count)
			for i := range src {
				src[i] = &Tensor{Name: fmt.Sprintf("t%d", i), DType: dtype.U8, Shape: []int64{size}, Device: buf, DeviceOffset: int64(i) * layout.stride}
			}
			pool := devicePool(b, d, DefaultBuffers, 64<<20)
			packOnly(b, src[:10], pool, pk) // warm up: loads the kernel
			b.SetBytes(count * size)
			for b.Loop() {
				packOnly(b, src, pool, pk)
			}
			per := b.Elapsed() / time.Duration(b.N*count)
			b.ReportMetric(float64(per.Nanoseconds())/1000, "µs/tensor")
			logPaths(b)
		})
	}
}

// BenchmarkGPUPackHost packs 1 GiB of host tensors (16 of 64 MiB in Go
// memory) into 256 MiB device buckets through the pinned staging ring.
func BenchmarkGPUPackHost(b *testing.B) {
	d := gputest.Device(b)
	const total, each = 1 << 30, 64 << 20
	var src tensorList
	for i := range total / each {
		data := make([]byte, each)
		for j := range data {
			data[j] = byte(j * (i + 1))
		}
		src = append(src, &Tensor{Name: fmt.Sprintf("w%d", i), DType: dtype.BF16, Shape: []int64{each / 2}, Data: data})
	}
	pk := testPacker(b, defaultPlan, gpu.DefaultStagingConfig())
	pool := devicePool(b, d, DefaultBuffers, 256<<20)
	b.SetBytes(total)
	for b.Loop() {
		packOnly(b, src, pool, pk)
	}
	b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// BenchmarkGPUPackDevice16GiB is BenchmarkGPUPackDevice at the size of the
// nccl benchmark: 16 GiB of device tensors (64 allocations of 256 MiB) into
// 1 GiB buckets, against one plain 16 GiB device-to-device copy, so that a
// round's fixed cost (tens of µs) no longer weighs on a 0.6 ms round; with
// the default plan and with the large copies on one to three streams.
func BenchmarkGPUPackDevice16GiB(b *testing.B) {
	d := gputest.Device(b)
	const total, each = 16 << 30, 256 << 20
	src := deviceTensors(b, d, total, each)
	b.Run("plainD2D", func(b *testing.B) { benchPlainD2D(b, d, total) })
	for _, c := range []struct {
		name string
		plan devicePlan
	}{
		{"pack", defaultPlan},
		{"pack-lanes1", devicePlan{gatherBelow: 16 << 20}},
		{"pack-lanes2", devicePlan{gatherBelow: 16 << 20, lanes: 2, laneAbove: 16 << 20}},
		{"pack-lanes3", devicePlan{gatherBelow: 16 << 20, lanes: 3, laneAbove: 16 << 20}},
		{"pack-again", defaultPlan}, // the first case after plainD2D has measured slower
	} {
		b.Run(c.name, func(b *testing.B) { benchPack(b, d, src, total, c.plan, 1<<30) })
	}
	b.Run("pack-checksum", func(b *testing.B) { benchPackSum(b, d, src, total, defaultPlan, 1<<30, true) })
	b.Run("pack-checksum-engine", func(b *testing.B) {
		benchPackSum(b, d, src, total, devicePlan{lanes: 4, laneAbove: 16 << 20}, 1<<30, true)
	})
}

// deviceTensors allocates total bytes of bf16 device tensors of each bytes,
// one allocation per tensor.
func deviceTensors(b *testing.B, d *gpu.CUDADevice, total, each int) tensorList {
	var src tensorList
	for i := range total / each {
		buf := gputest.Alloc(b, d, each)
		src = append(src, &Tensor{Name: fmt.Sprintf("w%d", i), DType: dtype.BF16, Shape: []int64{int64(each / 2)}, Device: buf})
	}
	return src
}

// benchPlainD2D is the baseline of the pack benchmarks: one plain
// device-to-device copy of total bytes per iteration.
func benchPlainD2D(b *testing.B, d *gpu.CUDADevice, total int) {
	s := gputest.Stream(b, d)
	from, to := gputest.Alloc(b, d, total), gputest.Alloc(b, d, total)
	b.SetBytes(int64(total))
	for b.Loop() {
		if err := s.CopyDtoD(to, 0, from, 0, total); err != nil {
			b.Fatal(err)
		}
		gputest.Sync(b, s)
	}
	b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// BenchmarkGPUCheckpoint packs a 4 GiB safetensors checkpoint (8 shards of
// BF16 tensors of 32 MiB, 8 MiB and 16 KiB, in the page cache: read once
// first) into 1 GiB device buckets through the pinned staging ring, against
// pinnedH2D, plain host-to-device copies of the same 4 GiB from pinned
// memory (1 GiB each). "pack" reports GB/s and its fraction of pinnedH2D
// (x-pinned; target 0.8); the other pack cases vary the ring (readers,
// slots × slot size, piece size); allocRing is the cost of pinning a ring
// (and freeing it), which a Packer avoids by keeping its ring's slots;
// cast-f16 and cast-f16-host pack the checkpoint cast to F16, on the GPU
// and on the host. Every pack case warms up with one round first, so that
// the timed rounds reuse the slots. Each tensor is read straight from its
// file (openFiles), with the preads source.Checkpoint makes. The reads
// alone, without the GPU, are gpu's BenchmarkStagingReadOnly.
//
//	stages.test -test.run '^$' -test.bench 'GPUCheckpoint' -test.benchtime 3x
func BenchmarkGPUCheckpoint(b *testing.B) {
	d := gputest.Device(b)
	const total = 4 << 30
	dir := safetensorstest.Bench(b, total, 8)
	warmFiles(b, dir)
	ckpt := openFiles(b, dir)
	var pinned float64 // GB/s of pinnedH2D
	b.Run("pinnedH2D", func(b *testing.B) {
		s := gputest.Stream(b, d)
		host := gputest.Alloc(b, d.PinnedHost(), 1<<30)
		dev := gputest.Alloc(b, d, 1<<30)
		b.SetBytes(total)
		for b.Loop() {
			for range total / (1 << 30) {
				if err := s.CopyHtoD(dev, 0, host.Host()); err != nil {
					b.Fatal(err)
				}
			}
			gputest.Sync(b, s)
		}
		pinned = float64(total) * float64(b.N) / b.Elapsed().Seconds() / 1e9
		b.ReportMetric(pinned, "GB/s")
	})
	def := gpu.DefaultStagingConfig()
	ring := func(slots int, slotSize, piece int64, readers int) gpu.StagingConfig {
		return gpu.StagingConfig{Slots: slots, SlotSize: slotSize, Piece: piece, Readers: readers}
	}
	cases := []struct {
		name string
		cfg  gpu.StagingConfig
	}{
		{"pack", def},
		{"pack-readers=8", ring(def.Slots, def.SlotSize, def.Piece, 8)},
		{"pack-readers=16", ring(def.Slots, def.SlotSize, def.Piece, 16)},
		{"pack-8x8MiB", ring(8, 8<<20, def.Piece, def.Readers)},
		{"pack-piece=1MiB", ring(def.Slots, def.SlotSize, 1<<20, def.Readers)},
	}
	pack := func(b *testing.B, src Source, pk *Packer) {
		pool := devicePool(b, d, DefaultBuffers, 1<<30)
		packOnly(b, src, pool, pk) // warm up: loads the kernels, pins the ring
		b.SetBytes(total)
		b.ResetTimer()
		for b.Loop() {
			packOnly(b, src, pool, pk)
		}
		gbs := float64(total) * float64(b.N) / b.Elapsed().Seconds() / 1e9
		b.ReportMetric(gbs, "GB/s")
		if pinned > 0 {
			b.ReportMetric(gbs/pinned, "x-pinned")
		}
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			pack(b, ckpt, testPacker(b, defaultPlan, c.cfg))
		})
	}
	// The checkpoint cast to F16 as it is packed (GB/s of checkpoint
	// bytes): by the GPU cast kernel from staged source bytes, and on the
	// host as the readers read.
	for _, hostCast := range []bool{false, true} {
		name := "cast-f16"
		if hostCast {
			name += "-host"
		}
		b.Run(name, func(b *testing.B) {
			plan := defaultPlan
			plan.hostCast = hostCast
			pack(b, Cast(ckpt, dtype.F16), testPacker(b, plan, def))
		})
	}
	b.Run("allocRing", func(b *testing.B) {
		for b.Loop() {
			var bufs []mem.Buffer
			for range def.Slots {
				bufs = append(bufs, gpuAllocNoCleanup(b, d, int(def.SlotSize)))
			}
			for _, buf := range bufs {
				if err := buf.Free(); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/ring")
	})
}

// BenchmarkGPUQuantizePack16GiB quantizes 16 GiB of BF16 device weights
// (64 of [8192, 16384], 256 MiB each, normal values) to block-scaled FP8
// while packing them into 1 GiB device buckets (Quantize: the GPU
// quantize kernel writes each chunk's codes into its bucket, the scale
// tensors are copied from scratch), with and without the bucket
// checksum, against plainD2D, one plain device-to-device copy of the
// same 16 GiB, and pack, the weights packed as they are. Every case
// reports GB/s of BF16 bytes read (the quantized buckets hold half as
// many bytes).
//
//	stages.test -test.run '^$' -test.bench 'GPUQuantizePack16GiB' -test.benchtime 5x
func BenchmarkGPUQuantizePack16GiB(b *testing.B) {
	d := gputest.Device(b)
	const total, rows, cols = 16 << 30, 8192, 16384
	each := rows * cols * 2
	s := gputest.Stream(b, d)
	rng := rand.New(rand.NewPCG(16, 16))
	piece := bf16Weights(rng, 8<<20, 0.02) // 16 MiB, repeated through each weight
	var src tensorList
	for i := range total / each {
		buf := gputest.Alloc(b, d, each)
		gputest.Upload(b, s, buf, 0, piece)
		for off := len(piece); off < each; off += len(piece) {
			if err := s.CopyDtoD(buf, off, buf, 0, len(piece)); err != nil {
				b.Fatal(err)
			}
		}
		src = append(src, &Tensor{Name: fmt.Sprintf("model.layers.%d.mlp.up_proj.weight", i), DType: dtype.BF16, Shape: []int64{rows, cols}, Device: buf})
	}
	gputest.Sync(b, s)
	qs, err := Quantize(src, QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("plainD2D", func(b *testing.B) { benchPlainD2D(b, d, total) })
	b.Run("pack", func(b *testing.B) { benchPack(b, d, src, total, defaultPlan, 1<<30) })
	b.Run("quantize-pack", func(b *testing.B) { benchPack(b, d, qs, total, defaultPlan, 1<<30) })
	b.Run("quantize-pack-checksum", func(b *testing.B) { benchPackSum(b, d, qs, total, defaultPlan, 1<<30, true) })
}
