package gpu

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
)

// testGather returns a Gather of s, with its kernel or without (the tests
// check which).
func testGather(tb testing.TB, s *Stream) *Gather {
	tb.Helper()
	return testKernel(tb, s, "gather", func() (*Gather, error) { return s.NewGather(), nil })
}

// TestGatherGPU copies random ranges (1 byte to 1 MiB, random alignments
// on both sides) out of several source buffers into one destination with
// the gather kernel, and compares every byte of the destination, gaps
// included; then again through descriptor slots of 64 ranges, so that the
// slot ring wraps many times.
func TestGatherGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	const srcSize, dstSize = 16 << 20, 64 << 20
	srcs := make([]mem.Buffer, 4)
	host := make([][]byte, len(srcs))
	for i := range srcs {
		srcs[i] = alloc(t, d, srcSize)
		host[i] = pattern(srcSize, uint64(20+i))
		if err := s.CopyHtoD(srcs[i], 0, host[i]); err != nil {
			t.Fatal(err)
		}
	}
	dst := alloc(t, d, dstSize)
	for _, slotRanges := range []int{gatherSlotRanges, 64} {
		t.Run(fmt.Sprintf("slot=%d", slotRanges), func(t *testing.T) {
			g := testGather(t, s)
			if ok, why := g.Kernel(); !ok {
				t.Fatalf("the gather kernel is unavailable on %s: %v", d.Name(), why)
			}
			g.ring.slotDescs = slotRanges
			if err := s.Memset(dst, 0, dstSize, 0); err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(slotRanges), 9))
			want := make([]byte, dstSize)
			var b CopyBatch
			for at := 0; ; {
				n := 1 + int(rng.ExpFloat64()*4096)
				switch rng.IntN(8) {
				case 0:
					n = 1 + rng.IntN(1<<20)
				case 1:
					n = (n + 15) &^ 15
				}
				n = min(n, 1<<20)
				at += rng.IntN(100)
				if rng.IntN(2) == 0 {
					at = (at + 15) &^ 15
				}
				if at+n > dstSize {
					break
				}
				i := rng.IntN(len(srcs))
				off := rng.IntN(srcSize - n)
				if rng.IntN(2) == 0 {
					off &^= 15
				}
				b.Add(dst.DevicePtr()+uint64(at), srcs[i].DevicePtr()+uint64(off), int64(n))
				copy(want[at:at+n], host[i][off:off+n])
				at += n
			}
			copies, total := b.Len(), b.Bytes()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			if err := g.Copy(ctx, &b); err != nil {
				t.Fatal(err)
			}
			syncStream(t, s)
			took := time.Since(start)
			if b.Len() != 0 {
				t.Fatal("Copy did not empty the batch")
			}
			got := make([]byte, dstSize)
			if err := s.CopyDtoH(got, dst, 0); err != nil {
				t.Fatal(err)
			}
			syncStream(t, s)
			if i := diffAt(got, want); i >= 0 {
				t.Fatalf("byte %d of the destination is %#x, want %#x", i, got[i], want[i])
			}
			path, why := LastGatherPath()
			if path != GatherKernel {
				t.Fatalf("copies queued with %v: %v", path, why)
			}
			t.Logf("%d copies, %d bytes, byte-identical, in %v with the %v", copies, total, took, path)
		})
	}
}

// TestGatherFallbackGPU turns the kernel off (GatherEnv) for a new device
// and checks that Gather still copies, through CopyBatch, and says why.
func TestGatherFallbackGPU(t *testing.T) {
	skipWithoutCUDA(t)
	t.Setenv(GatherEnv, "off")
	d := testDevice(t)
	s := testStream(t, d)
	g := testGather(t, s)
	ok, why := g.Kernel()
	if ok || !errors.Is(why, ErrNoGatherKernel) {
		t.Fatalf("Kernel() = %v, %v with %s=off", ok, why, GatherEnv)
	}
	const n = 1 << 20
	src, dst := alloc(t, d, n), alloc(t, d, n)
	want := pattern(n, 3)
	if err := s.CopyHtoD(src, 0, want); err != nil {
		t.Fatal(err)
	}
	var b CopyBatch
	for off := 0; off < n; off += 1000 {
		m := min(1000, n-off)
		b.Add(dst.DevicePtr()+uint64(off), src.DevicePtr()+uint64(off), int64(m))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.Copy(ctx, &b); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := s.CopyDtoH(got, dst, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	if i := diffAt(got, want); i >= 0 {
		t.Fatalf("byte %d differs", i)
	}
	if path, why := LastGatherPath(); path != GatherCopyBatch || !errors.Is(why, ErrNoGatherKernel) {
		t.Fatalf("LastGatherPath() = %v, %v", path, why)
	}
	t.Logf("fell back as it should: %v", why)
}

// BenchmarkGather64x16MiB copies 1 GiB as 64 copies of 16 MiB out of 64
// separate allocations into one buffer, the way pack fills buckets from
// large tensors, with each way of queueing copies, against one plain copy
// of 1 GiB. It reports GB/s of bytes copied.
func BenchmarkGather64x16MiB(b *testing.B) {
	d := testDevice(b)
	const each, count = 16 << 20, 64
	srcs := make([]mem.Buffer, count)
	for i := range srcs {
		srcs[i] = alloc(b, d, each)
	}
	dst := alloc(b, d, each*count)
	fill := func(cb *CopyBatch) {
		for i, src := range srcs {
			cb.Add(dst.DevicePtr()+uint64(i*each), src.DevicePtr(), each)
		}
	}
	b.Run("plain1GiB", func(b *testing.B) {
		src := alloc(b, d, each*count)
		benchCopy(b, d, each*count, func(s *Stream) error { return s.CopyDtoD(dst, 0, src, 0, each*count) })
	})
	b.Run("batch", func(b *testing.B) {
		var cb CopyBatch
		benchCopy(b, d, each*count, func(s *Stream) error { fill(&cb); return s.CopyBatch(&cb) })
	})
	b.Run("perCopy", func(b *testing.B) {
		cb := CopyBatch{PerCopy: true}
		benchCopy(b, d, each*count, func(s *Stream) error { fill(&cb); return s.CopyBatch(&cb) })
	})
	for _, chunk := range []uint64{0, 16 << 10, 256 << 10, 1 << 20} {
		name := fmt.Sprintf("kernel-chunk=%dKiB", chunk>>10)
		if chunk == 0 {
			name = fmt.Sprintf("kernel-chunk=default(%dKiB)", gatherPiece(each*count)>>10)
		}
		b.Run(name, func(b *testing.B) {
			var g *Gather
			var cb CopyBatch
			benchCopy(b, d, each*count, func(s *Stream) error {
				if g == nil {
					g = testGather(b, s)
					if ok, why := g.Kernel(); !ok {
						b.Skip(why)
					}
					g.chunk = chunk
				}
				fill(&cb)
				return g.Copy(context.Background(), &cb)
			})
		})
	}
}

// BenchmarkGather4KiB copies 100,000 scattered 4 KiB ranges per operation
// with the gather kernel and reports the cost per copy, to compare with
// BenchmarkCopyBatch4KiB (the copy engine).
func BenchmarkGather4KiB(b *testing.B) {
	d := testDevice(b)
	s := testStream(b, d)
	g := testGather(b, s)
	if ok, why := g.Kernel(); !ok {
		b.Skip(why)
	}
	const count, size = 100_000, 4 << 10
	src := alloc(b, d, count*2*size)
	dst := alloc(b, d, count*2*size)
	ctx := context.Background()
	benchScattered(b, s, src, dst, count, size, &CopyBatch{}, func(cb *CopyBatch) error { return g.Copy(ctx, cb) })
}
