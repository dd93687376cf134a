package gpu

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
)

func testQuantizer(tb testing.TB, s *Stream) *Quantizer {
	tb.Helper()
	return testKernel(tb, s, "quantize", func() (*Quantizer, error) {
		q := s.NewQuantizer()
		_, why := q.Kernel()
		return q, why
	})
}

// TestQuantGPU quantizes on the GPU weights of each dtype whose blocks are
// of every kind QuantTestWeight makes (random values, ties, NaNs,
// infinities, zeros, tiny scales, the dtype's largest values, the
// encoder's whole range, random bits), from single elements to 4096 ×
// 4100 with partial edge blocks, whole and in ranges that split blocks
// and rows, at offsets inside their buffers, and compares every code and
// scale with package quant; then a scales-only launch. The kernel must be
// quant.ptx, the converter's: a fall back to quant_int.ptx fails the test
// (saying why), though the bytes would be the same.
func TestQuantGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	q := testQuantizer(t, s)
	if ok, why := q.Converter(); !ok {
		t.Errorf("the quantize kernel fell back to quant_int.ptx: %v", why)
	}
	testQuantGPU(t, d, s, q)
}

// TestQuantGPUInt runs TestQuantGPU's checks on quant_int.ptx, the kernel
// Quantizer falls back to (QuantEnv=int, on a device of its own: the
// kernel is loaded once per device).
func TestQuantGPUInt(t *testing.T) {
	skipWithoutCUDA(t)
	t.Setenv(QuantEnv, "int")
	d := testDevice(t)
	s := testStream(t, d)
	q := testQuantizer(t, s)
	if ok, why := q.Converter(); ok || why == nil || !strings.Contains(why.Error(), QuantEnv) {
		t.Fatalf("Converter() = %v, %v; want quant_int.ptx, for %s=int", ok, why, QuantEnv)
	}
	testQuantGPU(t, d, s, q)
}

func testQuantGPU(t *testing.T, d *CUDADevice, s *Stream, q *Quantizer) {
	rng := rand.New(rand.NewPCG(23, 9))
	var ws []quantCheckWeight
	for _, c := range []struct {
		from       dtype.DType
		rows, cols int
		pieces     int
	}{
		{dtype.BF16, 4096, 4100, 1}, {dtype.BF16, 4096, 4100, 7}, {dtype.F16, 1000, 1000, 5},
		{dtype.F32, 1030, 2050, 3}, {dtype.BF16, 1, 1, 1}, {dtype.F32, 129, 1, 2}, {dtype.F16, 1, 3000, 4},
		{dtype.BF16, 2048, 2304, 3}, {dtype.F16, 1024, 1152, 2}, // full blocks only: the vector path, tiny scales included
	} {
		w := quantCheckWeight{from: c.from, rows: c.rows, cols: c.cols, src: QuantTestWeight(rng, c.from, c.rows, c.cols)}
		w.ranges = randomRanges(rng, int64(c.rows*c.cols), c.pieces)
		ws = append(ws, w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, w := range ws {
		t.Run(fmt.Sprintf("%d-%s-%dx%d", i, w.from, w.rows, w.cols), func(t *testing.T) {
			nbr, nbc := quant.ScaleShape(int64(w.rows), int64(w.cols))
			n := w.rows * w.cols
			// Offsets inside the buffers, so that nothing relies on an
			// allocation's alignment past the elements'; where the rows
			// are 16-byte aligned, offsets that keep them so and the
			// codes 8-byte aligned (the vector path, its stores too).
			so, co := 4, 1
			if w.cols%8 == 0 {
				so, co = 16, 8
			}
			src, codes, scales := alloc(t, d, len(w.src)+64), alloc(t, d, n+64), alloc(t, d, int(4*nbr*nbc)+64)
			if err := s.CopyHtoD(src, so, w.src); err != nil {
				t.Fatal(err)
			}
			if err := s.Memset(codes, 0, n+64, 0xA5); err != nil {
				t.Fatal(err)
			}
			if err := s.Memset(scales, 0, int(4*nbr*nbc)+64, 0xA5); err != nil {
				t.Fatal(err)
			}
			for _, r := range w.ranges {
				if err := q.Queue(QuantJob{Src: src.DevicePtr() + uint64(so), From: w.from, Rows: int64(w.rows), Cols: int64(w.cols),
					First: r[0], End: r[1], Dst: codes.DevicePtr() + uint64(co) + uint64(r[0]), Scales: scales.DevicePtr() + 8}); err != nil {
					t.Fatal(err)
				}
			}
			gotCodes, gotScales := make([]byte, n+64), make([]byte, int(4*nbr*nbc)+64)
			if err := s.CopyDtoH(gotCodes, codes, 0); err != nil {
				t.Fatal(err)
			}
			if err := s.CopyDtoH(gotScales, scales, 0); err != nil {
				t.Fatal(err)
			}
			if err := s.Sync(ctx); err != nil {
				t.Fatal(err)
			}
			wantCodes, wantScales, err := w.want()
			if err != nil {
				t.Fatal(err)
			}
			if err := compareQuant(w, gotCodes[co:], gotScales[8:], wantCodes, wantScales); err != nil {
				t.Fatal(err)
			}
			if gotCodes[co-1] != 0xA5 || gotCodes[n+co] != 0xA5 || gotScales[7] != 0xA5 || gotScales[8+4*nbr*nbc] != 0xA5 {
				t.Fatal("the kernel wrote outside the codes or the scales")
			}
		})
	}
	t.Run("scales-only", func(t *testing.T) {
		w := ws[2]
		nbr, nbc := quant.ScaleShape(int64(w.rows), int64(w.cols))
		src, scales := alloc(t, d, len(w.src)), alloc(t, d, int(4*nbr*nbc))
		if err := s.CopyHtoD(src, 0, w.src); err != nil {
			t.Fatal(err)
		}
		if err := q.Queue(QuantJob{Src: src.DevicePtr(), From: w.from, Rows: int64(w.rows), Cols: int64(w.cols), Scales: scales.DevicePtr()}); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 4*nbr*nbc)
		if err := s.CopyDtoH(got, scales, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		_, want, err := w.want()
		if err != nil {
			t.Fatal(err)
		}
		if err := compareQuant(w, nil, got, nil, want); err != nil {
			t.Fatal(err)
		}
	})
}

// TestQuantGPUOff checks that QuantEnv=off turns the kernel off with an
// error saying so, on a device of its own (the kernel is loaded once per
// device).
func TestQuantGPUOff(t *testing.T) {
	skipWithoutCUDA(t)
	t.Setenv(QuantEnv, "off")
	d := testDevice(t)
	s := testStream(t, d)
	q := s.NewQuantizer()
	ok, why := q.Kernel()
	if ok || !errors.Is(why, ErrNoQuantKernel) {
		t.Fatalf("Kernel() = %v, %v; want the kernel turned off", ok, why)
	}
	err := q.Queue(QuantJob{Src: 1 << 20, From: dtype.BF16, Rows: 1, Cols: 1, End: 1, Dst: 2 << 20, Scales: 3 << 20})
	if !errors.Is(err, ErrNoQuantKernel) {
		t.Fatalf("Queue: %v", err)
	}
}

// BenchmarkQuantGPU quantizes a 1 GiB BF16 weight [16384, 32768] of
// normal values (a 16 MiB piece repeated) on the GPU with quant.ptx
// (quantize) and quant_int.ptx (quantize-int, loaded on a second device
// with QuantEnv=int), against a device-to-device copy of the same bytes;
// GB/s count the BF16 bytes read.
//
//	gpu.test -test.run '^$' -test.bench QuantGPU -test.benchtime 10x
func BenchmarkQuantGPU(b *testing.B) {
	d := testDevice(b)
	s := testStream(b, d)
	q := testQuantizer(b, s)
	if ok, why := q.Converter(); !ok {
		b.Errorf("the quantize kernel fell back to quant_int.ptx: %v", why)
	}
	const rows, cols = 16384, 32768
	n := rows * cols
	src, dst := alloc(b, d, 2*n), alloc(b, d, 2*n)
	codes, scales := alloc(b, d, n), alloc(b, d, 4*(rows/128)*(cols/128))
	rng := rand.New(rand.NewPCG(1, 1))
	piece := make([]byte, 16<<20)
	for i := 0; i < len(piece); i += 2 {
		binary.LittleEndian.PutUint16(piece[i:], uint16(math.Float32bits(float32(rng.NormFloat64()*0.02))>>16))
	}
	for off := 0; off < 2*n; off += len(piece) {
		if err := s.CopyHtoD(src, off, piece); err != nil {
			b.Fatal(err)
		}
	}
	syncStream(b, s)
	quantize := func(b *testing.B, q *Quantizer) {
		b.SetBytes(int64(2 * n))
		for b.Loop() {
			if err := q.Queue(QuantJob{Src: src.DevicePtr(), From: dtype.BF16, Rows: rows, Cols: cols, End: int64(n),
				Dst: codes.DevicePtr(), Scales: scales.DevicePtr()}); err != nil {
				b.Fatal(err)
			}
			syncStream(b, q.s)
		}
		b.ReportMetric(float64(2*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	}
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(2 * n))
		for b.Loop() {
			if err := s.CopyDtoD(dst, 0, src, 0, 2*n); err != nil {
				b.Fatal(err)
			}
			syncStream(b, s)
		}
		b.ReportMetric(float64(2*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	})
	b.Run("quantize", func(b *testing.B) { quantize(b, q) })
	b.Run("quantize-int", func(b *testing.B) {
		b.Setenv(QuantEnv, "int")
		di := testDevice(b)
		qi := testQuantizer(b, testStream(b, di))
		if ok, _ := qi.Converter(); ok {
			b.Fatal("QuantEnv=int gave quant.ptx")
		}
		quantize(b, qi)
	})
}
