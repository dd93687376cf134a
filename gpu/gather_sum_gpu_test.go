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
// once (runSumSequence), plus 20,000 copies of 64 bytes (several
// launches, the descriptor ring wrapping) and copies of 64 MiB, and
// compares the bytes and the sums with checksum.Sum: through CopySum
// (which fuses only the larger copies), then through the fused kernel
// always, with the default pieces and with pieces of 16 KiB.
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
	fuse := false
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
		of := SumOf{Buf: v, N: int64(fc.l.n), Side: fc.l.side, Sums: c}
		var p *PendingSum
		if fuse {
			p, err = g.copySum(ctx, &b, of, true)
		} else {
			p, err = g.CopySum(ctx, &b, of)
		}
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
	for round, r := range []struct {
		fuse  bool
		chunk uint64 // 0: the default pieces
	}{{false, 0}, {true, 0}, {true, 16 << 10}} {
		fuse, g.chunk = r.fuse, r.chunk
		if err := runSumSequence(hostSummed, hostOther, layouts, queue, check); err != nil {
			t.Fatalf("round %d (fused always %v, pieces of %d bytes, 0 the default): %v", round, r.fuse, r.chunk, err)
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
// another stream, host memory, a copy off a word of the buffer when it
// would fuse the copies; and that it copies and sums small copies off a
// word, which it does not fuse.
func TestGatherSumGPURefuses(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	g, c := testGatherSum(t, s)
	other := testChecksummer(t, testStream(t, d))
	const n = 2 * gatherSumMinCopy
	host := pattern(n, 65)
	buf := alloc(t, d, n)
	hostBuf := alloc(t, mem.Host{}, n)
	src := alloc(t, d, n)
	if err := s.CopyHtoD(src, 0, host); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, of := range map[string]SumOf{
		"no Checksummer":         {Buf: buf, N: n},
		"another stream":         {Buf: buf, N: n, Sums: other},
		"host memory":            {Buf: hostBuf, N: n, Sums: c},
		"longer than the buffer": {Buf: buf, N: n + 1, Sums: c},
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
	b.Add(buf.DevicePtr()+4, src.DevicePtr(), gatherSumMinCopy)
	if p, err := g.CopySum(ctx, &b, SumOf{Buf: buf, N: n, Sums: c}); err == nil {
		p.Close()
		t.Error("a copy off a word: CopySum succeeded")
	} else {
		t.Logf("a copy off a word: %v", err)
	}
	// Small copies are copied, then summed: their layout does not matter.
	if err := s.Memset(buf, 0, n, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, n)
	b.Add(buf.DevicePtr()+4, src.DevicePtr(), 100)
	b.Add(buf.DevicePtr()+1000, src.DevicePtr()+3, 5000)
	copy(want[4:], host[:100])
	copy(want[1000:], host[3:5003])
	p, err := g.CopySum(ctx, &b, SumOf{Buf: buf, N: n, Sums: c})
	if err != nil {
		t.Fatalf("small copies off a word: %v", err)
	}
	defer p.Close()
	if got, err := p.Wait(ctx); err != nil || got != checksum.Sum(want) {
		t.Fatalf("small copies off a word: the sum is %#x (%v), want %#x", got, err, checksum.Sum(want))
	}
}

// fusedLayout is the layout of a fused-copy benchmark: a bucket and the
// tensors that fill copies into it (SumDst, pack) or out of it (SumSrc,
// load).
type fusedLayout struct {
	bucket mem.Buffer
	copies int
	bytes  int64 // copied per operation; the bucket's size
	fill   func(cb *CopyBatch, side SumSide)
}

// newFusedLayout allocates a bucket of count tensors of size bytes and
// the tensors, each in its own allocation or, for many, every other size
// bytes of one.
func newFusedLayout(b *testing.B, d *CUDADevice, count, size int) *fusedLayout {
	l := &fusedLayout{bucket: alloc(b, d, count*size), copies: count, bytes: int64(count * size)}
	tensors := make([]uint64, count)
	if count > 64 {
		scattered := alloc(b, d, 2*count*size)
		for i := range tensors {
			tensors[i] = scattered.DevicePtr() + uint64(2*i*size)
		}
	} else {
		for i := range tensors {
			tensors[i] = alloc(b, d, size).DevicePtr()
		}
	}
	l.fill = func(cb *CopyBatch, side SumSide) {
		for i, t := range tensors {
			at := l.bucket.DevicePtr() + uint64(i*size)
			if side == SumDst {
				cb.Add(at, t, int64(size))
			} else {
				cb.Add(t, at, int64(size))
			}
		}
	}
	return l
}

// fusedOp queues one operation of a fused-copy benchmark: the copies of
// cb, and the sum of of.Buf (nil where it sums nothing).
type fusedOp func(g *Gather, c *Checksummer, cb *CopyBatch, of SumOf) (*PendingSum, error)

// The ways the benchmarks copy and sum: the gather kernel alone; the
// gather kernel and the checksum kernel over the bucket (after the copies
// into it, before those out of it); CopySum, which sums as it copies
// where the copies are large enough; the fused kernel always.
var fusedOps = []struct {
	name string
	op   fusedOp
}{
	{"gather", opGather},
	{"gather+checksum", func(g *Gather, c *Checksummer, cb *CopyBatch, of SumOf) (*PendingSum, error) {
		if of.Side == SumSrc {
			p, err := c.Queue(of.Buf, of.N)
			if err != nil {
				return nil, err
			}
			return p, g.Copy(context.Background(), cb)
		}
		if err := g.Copy(context.Background(), cb); err != nil {
			return nil, err
		}
		return c.Queue(of.Buf, of.N)
	}},
	{"fused", func(g *Gather, c *Checksummer, cb *CopyBatch, of SumOf) (*PendingSum, error) {
		return g.CopySum(context.Background(), cb, of)
	}},
	{"fused-kernel", opFusedKernel},
}

func opGather(g *Gather, c *Checksummer, cb *CopyBatch, of SumOf) (*PendingSum, error) {
	return nil, g.Copy(context.Background(), cb)
}

func opFusedKernel(g *Gather, c *Checksummer, cb *CopyBatch, of SumOf) (*PendingSum, error) {
	return g.copySum(context.Background(), cb, of, true)
}

// benchFused runs one fused-copy benchmark of l's copies, side says which
// way, on a new stream of d with the Gather that gather makes: each
// operation hands the copies to op and waits for the stream and for the
// sum, if any. The first operation, a warm-up, also checks the sum
// against the checksum kernel's of the bucket. It reports GB/s of bytes
// copied and, for many copies, µs per copy (queueing included).
func benchFused(b *testing.B, d *CUDADevice, l *fusedLayout, side SumSide, gather func(*Stream) *Gather, op fusedOp) {
	s := testStream(b, d)
	g, c := gather(s), testChecksummer(b, s)
	of := SumOf{Buf: l.bucket, N: l.bytes, Side: side, Sums: c}
	var cb CopyBatch
	ctx := context.Background()
	run := func(check bool) {
		l.fill(&cb, side)
		p, err := op(g, c, &cb, of)
		if err != nil {
			b.Fatal(err)
		}
		if p != nil {
			sum, err := p.Wait(ctx)
			p.Close()
			if err != nil {
				b.Fatal(err)
			}
			if check {
				ref, err := c.Queue(l.bucket, l.bytes)
				if err != nil {
					b.Fatal(err)
				}
				want, err := ref.Wait(ctx)
				ref.Close()
				if err != nil || sum != want {
					b.Fatalf("the sum is %#x, the checksum kernel's %#x (%v)", sum, want, err)
				}
			}
		}
		syncStream(b, s)
	}
	run(true)
	b.SetBytes(l.bytes)
	b.ResetTimer()
	for range b.N {
		run(false)
	}
	b.ReportMetric(float64(l.bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	if l.copies > 64 {
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*l.copies), "µs/copy")
	}
}

// sides names the benchmarks' two ways.
var sides = []struct {
	name string
	side SumSide
}{{"pack", SumDst}, {"load", SumSrc}}

// BenchmarkGatherSum64x16MiB fills a 1 GiB bucket from 64 buffers of
// 16 MiB (pack) and copies it out into them (load), each way of fusedOps,
// and reports GB/s of bytes copied; compare with
// BenchmarkGather64x16MiB/plain1GiB (one plain copy).
func BenchmarkGatherSum64x16MiB(b *testing.B) {
	benchFusedOps(b, 64, 16<<20)
}

// BenchmarkGatherSum4KiB packs 100,000 scattered 4 KiB tensors into a
// bucket (and copies them out of it), each way of fusedOps, and reports
// GB/s of bytes copied and µs per copy.
func BenchmarkGatherSum4KiB(b *testing.B) {
	benchFusedOps(b, 100_000, 4<<10)
}

func benchFusedOps(b *testing.B, count, size int) {
	d := testDevice(b)
	l := newFusedLayout(b, d, count, size)
	for _, sd := range sides {
		for _, op := range fusedOps[:3] {
			b.Run(sd.name+"/"+op.name, func(b *testing.B) {
				benchFused(b, d, l, sd.side, func(s *Stream) *Gather { g, _ := testGatherSum(b, s); return g }, op.op)
			})
		}
	}
}

// BenchmarkGatherVariants runs the variants of the gather kernels
// (gatherVariants, each as the plain and the fused kernel) on one tensor
// of 1 GiB and 64 of 16 MiB (in pieces of 256 KiB to 1 MiB), 16 of
// 4 MiB (a 64 MiB bucket) and 100,000 of 4 KiB, each way, to choose the
// embedded ones (gatherDefault, gatherSumDefault) and GatherChunk. It
// reports GB/s of bytes copied.
func BenchmarkGatherVariants(b *testing.B) {
	d := testDevice(b)
	for _, c := range []struct {
		name        string
		count, size int
		chunks      []uint64
	}{
		{"1x1GiB", 1, 1 << 30, []uint64{256 << 10, 512 << 10, 1 << 20}},
		{"64x16MiB", 64, 16 << 20, []uint64{256 << 10, 512 << 10, 1 << 20}},
		{"16x4MiB", 16, 4 << 20, []uint64{256 << 10, 1 << 20}},
		{"100000x4KiB", 100_000, 4 << 10, []uint64{GatherChunk}},
	} {
		l := newFusedLayout(b, d, c.count, c.size)
		for _, sd := range sides {
			for _, chunk := range c.chunks {
				for _, v := range gatherVariants {
					for _, op := range []struct {
						name string
						op   fusedOp
					}{{"gather", opGather}, {"fused", opFusedKernel}} {
						name := fmt.Sprintf("%s/%s/chunk=%dKiB/%v/%s", c.name, sd.name, chunk>>10, v, op.name)
						b.Run(name, func(b *testing.B) {
							benchFused(b, d, l, sd.side, func(s *Stream) *Gather {
								g := variantGather(b, s, v)
								g.chunk = chunk
								return g
							}, op.op)
						})
					}
				}
			}
		}
	}
}

// BenchmarkGatherPieces copies buckets of 16 MiB to 1 GiB (from tensors
// of 4 and 16 MiB, or one of 1 GiB) each way, with the gather kernel and
// with the fused kernel, in pieces of 32 KiB to 1 MiB and in the default
// ones (gatherPiece), to choose those. It reports GB/s of bytes copied.
func BenchmarkGatherPieces(b *testing.B) {
	d := testDevice(b)
	for _, c := range []struct {
		name        string
		count, size int
	}{{"1x1GiB", 1, 1 << 30}, {"64x16MiB", 64, 16 << 20}, {"64x4MiB", 64, 4 << 20}, {"16x4MiB", 16, 4 << 20}, {"4x4MiB", 4, 4 << 20}} {
		l := newFusedLayout(b, d, c.count, c.size)
		for _, sd := range sides {
			for _, chunk := range []uint64{0, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20} {
				for _, op := range []struct {
					name string
					op   fusedOp
				}{{"gather", opGather}, {"fused", opFusedKernel}} {
					name := fmt.Sprintf("%s/%s/chunk=%dKiB/%s", c.name, sd.name, chunk>>10, op.name)
					if chunk == 0 {
						name = fmt.Sprintf("%s/%s/chunk=default(%dKiB)/%s", c.name, sd.name, gatherPiece(l.bytes)>>10, op.name)
					}
					b.Run(name, func(b *testing.B) {
						benchFused(b, d, l, sd.side, func(s *Stream) *Gather {
							g, _ := testGatherSum(b, s)
							g.chunk = chunk
							return g
						}, op.op)
					})
				}
			}
		}
	}
}

// BenchmarkGatherSumCopies packs about 400 MB of tensors of 4 KiB to
// 1 MiB into a bucket (and copies them out of it) each way of fusedOps,
// to choose gatherSumMinCopy: the copies below which copying, then
// summing, is faster than the fused kernel. It reports GB/s of bytes
// copied and µs per copy.
func BenchmarkGatherSumCopies(b *testing.B) {
	d := testDevice(b)
	for _, size := range []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20} {
		l := newFusedLayout(b, d, 400_000_000/size, size)
		for _, sd := range sides {
			for _, op := range fusedOps {
				b.Run(fmt.Sprintf("%dKiB/%s/%s", size>>10, sd.name, op.name), func(b *testing.B) {
					benchFused(b, d, l, sd.side, func(s *Stream) *Gather { g, _ := testGatherSum(b, s); return g }, op.op)
				})
			}
		}
	}
}

// variantGather returns a Gather of s whose kernels are the variant v of
// the gather kernels, plain and fused, loaded from their generated PTX in
// place of the embedded ones (without self-test: benchFused checks the
// sums), and unloaded when b ends, after the Gather's Close.
func variantGather(b *testing.B, s *Stream, v gatherGen) *Gather {
	d := s.Device()
	var ks [2]*loadedKernel
	for i, sum := range []bool{false, true} {
		gv, entry := v, "wc_gather"
		gv.sum = sum
		if sum {
			entry = "wc_gather_sum"
		}
		k, err := d.loadPTX(entry+" "+gv.String(), gv.ptx(), entry, ErrNoGatherKernel)
		if err != nil {
			b.Fatal(err)
		}
		closeAtEnd(b, func() error { return k.unload(d) })
		ks[i] = k
	}
	g := testGather(b, s)
	g.k, g.sumK, g.sumLoaded = ks[0], ks[1], true
	return g
}
