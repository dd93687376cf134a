package gpu

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/mem"
)

// testGatherSum returns a Gather of s whose CopySum fuses, failing the test
// where the fused kernel is unavailable, and a Checksummer of s.
func testGatherSum(tb testing.TB, s *Stream) (*Gather, *Checksummer) {
	tb.Helper()
	g := testGather(tb, s)
	if ok, why := g.SumKernel(); !ok {
		tb.Fatalf("the fused gather and checksum kernel is unavailable on %s: %v", s.Device().Name(), why)
	}
	return g, testChecksummer(tb, s)
}

// TestGatherSumGPU runs random layouts both ways (copies into the summed
// buffer and out of it) on device memory, several CopySums outstanding at
// once (runSumSequence), with the default pieces and with pieces of
// 16 KiB, plus 20,000 copies of 64 bytes (several launches, the
// descriptor ring wrapping) and copies of 64 MiB, and compares the bytes
// and the sums with checksum.Sum.
func TestGatherSumGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	g, c := testGatherSum(t, s)
	const size = 160 << 20
	summed, other := alloc(t, d, size), alloc(t, d, size)
	hostSummed, hostOther := pattern(size, 61), pattern(size, 62)
	if err := s.CopyHtoD(summed, 0, hostSummed); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyHtoD(other, 0, hostOther); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(61, 62))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var layouts []sumLayout
	for i := range 16 {
		layouts = append(layouts, randomSumLayout(rng, SumSide(i%2), 1<<20+rng.IntN(4<<20), 1<<20))
	}
	var many [][3]int
	for i := range 20000 {
		many = append(many, [3]int{128 * i, 80 * i, 64})
	}
	layouts = append(layouts, sumLayout{SumDst, 128 * 20000, 80 * 20000, many}, sumLayout{SumSrc, 128*20000 - 64, 80 * 20000, many})
	layouts = append(layouts, sumLayout{SumDst, 128<<20 + 3, 64<<20 + 16, [][3]int{{0, 0, 64 << 20}, {64<<20 + 64, 16, 64<<20 - 61}}})
	queue := func(fc *fusedCase) error {
		var b CopyBatch
		sb, ob := summed.DevicePtr()+uint64(fc.summedAt), other.DevicePtr()+uint64(fc.otherAt)
		for _, cp := range fc.l.copies {
			at, o, n := uint64(cp[0]), uint64(cp[1]), int64(cp[2])
			if fc.l.side == SumDst {
				b.Add(sb+at, ob+o, n)
			} else {
				b.Add(ob+o, sb+at, n)
			}
		}
		v, err := d.View(sb, fc.l.n)
		if err != nil {
			return err
		}
		p, err := g.CopySum(ctx, &b, SumOf{Buf: v, N: int64(fc.l.n), Side: fc.l.side, Sums: c})
		if err != nil {
			return err
		}
		fc.wait = func() (uint64, error) {
			defer p.Close()
			return p.Wait(ctx)
		}
		return nil
	}
	check := func(cases []*fusedCase) error {
		for _, fc := range cases {
			sum, err := fc.wait()
			if err != nil {
				return err
			}
			gotSummed, gotOther := make([]byte, fc.l.n), make([]byte, fc.l.other)
			if err := s.CopyDtoHPtr(gotSummed, summed.DevicePtr()+uint64(fc.summedAt)); err != nil {
				return err
			}
			if err := s.CopyDtoHPtr(gotOther, other.DevicePtr()+uint64(fc.otherAt)); err != nil {
				return err
			}
			if err := s.Sync(ctx); err != nil {
				return err
			}
			if err := fc.check(sum, gotSummed, gotOther); err != nil {
				return err
			}
		}
		return nil
	}
	for round, chunk := range []uint64{GatherChunk, 16 << 10} {
		g.chunk = chunk
		if err := runSumSequence(hostSummed, hostOther, layouts, queue, check); err != nil {
			t.Fatalf("round %d (pieces of %d bytes): %v", round, chunk, err)
		}
	}
}

// TestGatherSumGPUFallback turns the fused kernel off (GatherSumEnv) for
// a new device and checks that CopySum still copies and sums, with Copy
// and the checksum kernel, and that SumKernel says why.
func TestGatherSumGPUFallback(t *testing.T) {
	skipWithoutCUDA(t)
	t.Setenv(GatherSumEnv, "off")
	d := testDevice(t)
	s := testStream(t, d)
	g := testGather(t, s)
	c := testChecksummer(t, s)
	if ok, why := g.SumKernel(); ok || !errors.Is(why, ErrNoGatherSumKernel) {
		t.Fatalf("SumKernel() = %v, %v with %s=off", ok, why, GatherSumEnv)
	}
	const n = 1 << 20
	src, dst := alloc(t, d, n), alloc(t, d, n)
	host := pattern(n, 63)
	if err := s.CopyHtoD(src, 0, host); err != nil {
		t.Fatal(err)
	}
	if err := s.Memset(dst, 0, n, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, n)
	var b CopyBatch
	for off := 0; off+1000 <= n; off += 1024 {
		b.Add(dst.DevicePtr()+uint64(off), src.DevicePtr()+uint64(off), 1000)
		copy(want[off:off+1000], host[off:off+1000])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := g.CopySum(ctx, &b, SumOf{Buf: dst, N: n, Side: SumDst, Sums: c})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got, err := p.Wait(ctx); err != nil || got != checksum.Sum(want) {
		t.Fatalf("CopySum without the fused kernel: %#x, %v; want %#x", got, err, checksum.Sum(want))
	}
	got := make([]byte, n)
	if err := s.CopyDtoH(got, dst, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	if i := diffAt(got, want); i >= 0 {
		t.Fatalf("byte %d differs", i)
	}
}

// TestGatherSumGPURefuses checks CopySum's errors: no Checksummer, one of
// another stream, host memory, a copy off a word of the buffer.
func TestGatherSumGPURefuses(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	g, c := testGatherSum(t, s)
	other := testChecksummer(t, testStream(t, d))
	buf, src := alloc(t, d, 4096), alloc(t, d, 4096)
	hostBuf := alloc(t, mem.Host{}, 4096)
	ctx := context.Background()
	for name, of := range map[string]SumOf{
		"no Checksummer":         {Buf: buf, N: 4096},
		"another stream":         {Buf: buf, N: 4096, Sums: other},
		"host memory":            {Buf: hostBuf, N: 4096, Sums: c},
		"longer than the buffer": {Buf: buf, N: 4097, Sums: c},
	} {
		var b CopyBatch
		b.Add(buf.DevicePtr(), src.DevicePtr(), 100)
		if p, err := g.CopySum(ctx, &b, of); err == nil {
			p.Close()
			t.Errorf("%s: CopySum succeeded", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	var b CopyBatch
	b.Add(buf.DevicePtr()+4, src.DevicePtr(), 100)
	if p, err := g.CopySum(ctx, &b, SumOf{Buf: buf, N: 4096, Sums: c}); err == nil {
		p.Close()
		t.Error("a copy off a word: CopySum succeeded")
	} else {
		t.Logf("a copy off a word: %v", err)
	}
}

// benchFused runs one fused-copy benchmark on a stream of d: each
// operation hands the copies fill adds to op and waits for the stream (and
// the sum op returns, if any); it reports GB/s of bytes copied. perSM sets
// the fused kernel's blocks per multiprocessor (0: the default).
func benchFused(b *testing.B, d *CUDADevice, perSM int, fill func(*CopyBatch), op func(s *Stream, g *Gather, c *Checksummer, cb *CopyBatch) (*PendingSum, error)) {
	var g *Gather
	var c *Checksummer
	var cb CopyBatch
	ctx := context.Background()
	benchCopy(b, d, func(s *Stream) error {
		if g == nil {
			g, c = testGatherSum(b, s)
			g.sumPerSM = perSM
		}
		fill(&cb)
		p, err := op(s, g, c, &cb)
		if err != nil || p == nil {
			return err
		}
		defer p.Close()
		_, err = p.Wait(ctx)
		return err
	})
}

// BenchmarkGatherSum64x16MiB fills a 1 GiB bucket from 64 buffers of
// 16 MiB (pack) and copies it out into them (load), each way: the gather
// kernel alone; the gather kernel, then the checksum kernel over the
// bucket; and CopySum, which sums as it copies. It reports GB/s of bytes
// copied; compare with BenchmarkGather64x16MiB/plain1GiB (one plain copy).
func BenchmarkGatherSum64x16MiB(b *testing.B) {
	d := testDevice(b)
	const each, count = 16 << 20, 64
	srcs := make([]mem.Buffer, count)
	for i := range srcs {
		srcs[i] = alloc(b, d, each)
	}
	bucket := alloc(b, d, each*count)
	ctx := context.Background()
	for _, side := range []SumSide{SumDst, SumSrc} {
		name := map[SumSide]string{SumDst: "pack", SumSrc: "load"}[side]
		fill := func(cb *CopyBatch) {
			for i, t := range srcs {
				if side == SumDst {
					cb.Add(bucket.DevicePtr()+uint64(i*each), t.DevicePtr(), each)
				} else {
					cb.Add(t.DevicePtr(), bucket.DevicePtr()+uint64(i*each), each)
				}
			}
		}
		b.Run(name+"/gather", func(b *testing.B) {
			benchFused(b, d, 0, fill, func(s *Stream, g *Gather, c *Checksummer, cb *CopyBatch) (*PendingSum, error) {
				return nil, g.Copy(ctx, cb)
			})
		})
		b.Run(name+"/gather+checksum", func(b *testing.B) {
			benchFused(b, d, 0, fill, func(s *Stream, g *Gather, c *Checksummer, cb *CopyBatch) (*PendingSum, error) {
				if side == SumSrc {
					p, err := c.Queue(bucket, each*count)
					if err != nil {
						return nil, err
					}
					return p, g.Copy(ctx, cb)
				}
				if err := g.Copy(ctx, cb); err != nil {
					return nil, err
				}
				return c.Queue(bucket, each*count)
			})
		})
		b.Run(name+"/fused", func(b *testing.B) {
			benchFused(b, d, 0, fill, func(s *Stream, g *Gather, c *Checksummer, cb *CopyBatch) (*PendingSum, error) {
				return g.CopySum(ctx, cb, SumOf{Buf: bucket, N: each * count, Side: side, Sums: c})
			})
		})
	}
}

// BenchmarkGatherSum4KiB packs 100,000 scattered 4 KiB tensors into a
// bucket (and copies them out of it), each way as BenchmarkGatherSum64x16MiB
// does, and reports GB/s of bytes copied and µs per copy.
func BenchmarkGatherSum4KiB(b *testing.B) {
	d := testDevice(b)
	const count, size = 100_000, 4 << 10
	scattered := alloc(b, d, count*2*size)
	bucket := alloc(b, d, count*size)
	ctx := context.Background()
	for _, side := range []SumSide{SumDst, SumSrc} {
		name := map[SumSide]string{SumDst: "pack", SumSrc: "load"}[side]
		fill := func(cb *CopyBatch) {
			for i := range count {
				at, t := bucket.DevicePtr()+uint64(i*size), scattered.DevicePtr()+uint64(2*i*size)
				if side == SumDst {
					cb.Add(at, t, size)
				} else {
					cb.Add(t, at, size)
				}
			}
		}
		ops := map[string]func(s *Stream, g *Gather, c *Checksummer, cb *CopyBatch) (*PendingSum, error){
			"gather": func(s *Stream, g *Gather, c *Checksummer, cb *CopyBatch) (*PendingSum, error) {
				return nil, g.Copy(ctx, cb)
			},
			"gather+checksum": func(s *Stream, g *Gather, c *Checksummer, cb *CopyBatch) (*PendingSum, error) {
				if err := g.Copy(ctx, cb); err != nil {
					return nil, err
				}
				return c.Queue(bucket, count*size)
			},
			"fused": func(s *Stream, g *Gather, c *Checksummer, cb *CopyBatch) (*PendingSum, error) {
				return g.CopySum(ctx, cb, SumOf{Buf: bucket, N: count * size, Side: side, Sums: c})
			},
		}
		for _, op := range []string{"gather", "gather+checksum", "fused"} {
			b.Run(fmt.Sprintf("%s/%s", name, op), func(b *testing.B) {
				benchFused(b, d, 0, fill, ops[op])
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*count), "µs/copy")
			})
		}
		// Fewer blocks add their sums into the slots fewer times.
		for _, perSM := range []int{2, 4, 16} {
			b.Run(fmt.Sprintf("%s/fused-blocksPerSM=%d", name, perSM), func(b *testing.B) {
				benchFused(b, d, perSM, fill, ops["fused"])
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*count), "µs/copy")
			})
		}
	}
}
