package gpu

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
)

func testCaster(tb testing.TB, s *Stream) *Caster {
	tb.Helper()
	return testKernel(tb, s, "cast", func() (*Caster, error) {
		c := s.NewCaster()
		_, why := c.Kernel()
		return c, why
	})
}

// TestCastGPU converts on the GPU every 16-bit input of BF16→F16,
// F16→BF16, BF16→F32 and F16→F32 (aligned, and at misaligned addresses),
// and the float32 edge cases plus 4 million random bit patterns to BF16
// and F16, all in one Flush, and compares every output byte with
// cast.Convert; then the same through descriptor slots of 64 pieces of
// 4096 elements, so that the slot ring wraps many times.
func TestCastGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	every := all16()
	random := f32Inputs(4<<20+3, 51)
	jobs := append(castCasesAligned(every, random), []castCase{
		{dtype.BF16, dtype.F16, every, 2, 6},
		{dtype.F16, dtype.BF16, every, 6, 2},
		{dtype.BF16, dtype.F32, every, 2, 4},
		{dtype.F16, dtype.F32, every, 8, 12},
		{dtype.F32, dtype.BF16, random[:4<<16], 4, 2},
		{dtype.F32, dtype.F16, random[:4<<16], 12, 2},
		{dtype.F32, dtype.F32, random[:4<<16], 0, 4},
		{dtype.BF16, dtype.BF16, every, 0, 0},
		{dtype.F16, dtype.F16, every, 2, 0},
	}...)
	// Inputs and outputs each in a buffer of their own, 256-byte aligned
	// plus the job's offset.
	var srcOffs, dstOffs []int
	srcSize, dstSize := 0, 0
	for _, j := range jobs {
		n := len(j.src) / j.from.Size()
		srcOffs = append(srcOffs, srcSize+int(j.srcOff))
		dstOffs = append(dstOffs, dstSize+int(j.dstOff))
		srcSize += (int(j.srcOff) + len(j.src) + 255) &^ 255
		dstSize += (int(j.dstOff) + n*j.to.Size() + 255) &^ 255
	}
	hostSrc := make([]byte, srcSize)
	for i, j := range jobs {
		copy(hostSrc[srcOffs[i]:], j.src)
	}
	src, dst := alloc(t, d, srcSize), alloc(t, d, dstSize)
	if err := s.CopyHtoD(src, 0, hostSrc); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, slotDescs := range []int{castSlotDescs, 64} {
		t.Run(fmt.Sprintf("slot=%d", slotDescs), func(t *testing.T) {
			c := testCaster(t, s)
			if slotDescs != castSlotDescs {
				c.ring.slotDescs, c.chunk = slotDescs, 4096
			}
			if err := s.Memset(dst, 0, dstSize, 0xA5); err != nil {
				t.Fatal(err)
			}
			for i, j := range jobs {
				n := len(j.src) / j.from.Size()
				if err := c.Add(dst.DevicePtr()+uint64(dstOffs[i]), src.DevicePtr()+uint64(srcOffs[i]), int64(n), j.from, j.to); err != nil {
					t.Fatal(err)
				}
			}
			start := time.Now()
			if err := c.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if c.Len() != 0 {
				t.Fatalf("%d conversions left after Flush", c.Len())
			}
			got := make([]byte, dstSize)
			if err := s.CopyDtoH(got, dst, 0); err != nil {
				t.Fatal(err)
			}
			syncStream(t, s)
			elapsed := time.Since(start)
			elems := 0
			for i, j := range jobs {
				n := len(j.src) / j.from.Size()
				elems += n
				want := make([]byte, n*j.to.Size())
				if err := cast.Convert(want, j.to, j.src, j.from); err != nil {
					t.Fatal(err)
				}
				out := got[dstOffs[i] : dstOffs[i]+len(want)]
				if k := diffAt(out, want); k >= 0 {
					e, sz := k/j.to.Size(), j.to.Size()
					t.Fatalf("%s to %s at +%d/+%d: element %d (input % x) is % x, want % x", j.from, j.to, j.srcOff, j.dstOff,
						e, j.src[e*j.from.Size():(e+1)*j.from.Size()], out[e*sz:(e+1)*sz], want[e*sz:(e+1)*sz])
				}
			}
			t.Logf("%d conversions, %d elements, bit-identical to package cast, in %v (with the copy back)", len(jobs), elems, elapsed)
		})
	}
}

// TestCastGPUOff: CastEnv=off leaves the Caster of a device opened
// afresh without its kernel, and Add and Flush say why.
func TestCastGPUOff(t *testing.T) {
	t.Setenv(CastEnv, "off")
	d := testDevice(t)
	s := testStream(t, d)
	c := s.NewCaster()
	if ok, why := c.Kernel(); ok || !errors.Is(why, ErrNoCastKernel) {
		t.Fatalf("Kernel with %s=off: %v, %v", CastEnv, ok, why)
	}
	buf := alloc(t, d, 64)
	if err := c.Add(buf.DevicePtr(), buf.DevicePtr()+32, 4, dtype.F32, dtype.BF16); !errors.Is(err, ErrNoCastKernel) {
		t.Fatalf("Add: %v", err)
	}
	if err := c.Flush(context.Background()); err != nil {
		t.Fatalf("Flush of nothing: %v", err)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkCast1GiB converts 1 GiB of float32 (268 million elements) to
// BF16 and to F16 per operation, Flush to stream sync, and reports GB/s of
// source bytes. Compare with BenchmarkCopyDtoD (a plain copy of 1 GiB).
func BenchmarkCast1GiB(b *testing.B) {
	d := testDevice(b)
	s := testStream(b, d)
	c := testCaster(b, s)
	src := alloc(b, d, benchBytes)
	dst := alloc(b, d, benchBytes/2)
	if err := s.Memset(src, 0, benchBytes, 0x3f); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, to := range []dtype.DType{dtype.BF16, dtype.F16} {
		b.Run("F32-"+to.String(), func(b *testing.B) {
			run := func() {
				if err := c.Add(dst.DevicePtr(), src.DevicePtr(), benchBytes/4, dtype.F32, to); err != nil {
					b.Fatal(err)
				}
				if err := c.Flush(ctx); err != nil {
					b.Fatal(err)
				}
				syncStream(b, s)
			}
			run()
			b.SetBytes(benchBytes)
			b.ResetTimer()
			for range b.N {
				run()
			}
			b.ReportMetric(float64(benchBytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
