package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
)

// refQuantize quantizes a [rows, cols] weight of float32 values straight
// from the rule of the package doc, in float64 arithmetic (a float64
// quotient of two float32s rounded to float32 is their correctly rounded
// float32 quotient, so this shares no arithmetic with the fast path), and
// refEncode. It returns the codes and the scales' bits.
func refQuantize(w []float32, rows, cols int) ([]byte, []uint32) {
	br, bc := (rows+127)/128, (cols+127)/128
	scales := make([]uint32, br*bc)
	codes := make([]byte, rows*cols)
	for i := range br {
		for j := range bc {
			amax, finite := 0.0, true
			for r := i * 128; r < min(rows, i*128+128); r++ {
				for c := j * 128; c < min(cols, j*128+128); c++ {
					v := float64(w[r*cols+c])
					if math.IsNaN(v) || math.IsInf(v, 0) {
						finite = false
					}
					amax = math.Max(amax, math.Abs(v))
				}
			}
			var s float32
			switch {
			case !finite:
				s = float32(math.NaN())
			case float32(amax/448) < 0x1p-126:
				s = 1
			default:
				s = float32(amax / 448)
			}
			scales[i*bc+j] = math.Float32bits(s)
			if !finite {
				scales[i*bc+j] = 0x7FC00000
			}
			for r := i * 128; r < min(rows, i*128+128); r++ {
				for c := j * 128; c < min(cols, j*128+128); c++ {
					if !finite {
						codes[r*cols+c] = 0x7F
						continue
					}
					codes[r*cols+c] = refEncode(float32(float64(w[r*cols+c]) / float64(s)))
				}
			}
		}
	}
	return codes, scales
}

// toBytes encodes w as dtype d (BF16 and F16 by package cast's rounding);
// it returns the bytes and the values they hold.
func toBytes(w []float32, d dtype.DType) ([]byte, []float32) {
	f32 := make([]byte, 4*len(w))
	for i, v := range w {
		binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(v))
	}
	if d == dtype.F32 {
		return f32, w
	}
	out := make([]byte, 2*len(w))
	if err := cast.Convert(out, d, f32, dtype.F32); err != nil {
		panic(err)
	}
	back := make([]byte, 4*len(w))
	if err := cast.Convert(back, dtype.F32, out, d); err != nil {
		panic(err)
	}
	held := make([]float32, len(w))
	for i := range held {
		held[i] = math.Float32frombits(binary.LittleEndian.Uint32(back[4*i:]))
	}
	return out, held
}

// Case is a named weight for the block tests.
type blockCase struct {
	name       string
	rows, cols int
	w          []float32
}

// blockCases returns random and adversarial weights: zeros, one huge
// value, the subnormal code range, values at rounding midpoints after
// scaling, NaN and Inf, and partial edge blocks.
func blockCases() []blockCase {
	rng := rand.New(rand.NewPCG(7, 8))
	normal := func(rows, cols int, sd float64) []float32 {
		w := make([]float32, rows*cols)
		for i := range w {
			w[i] = float32(rng.NormFloat64() * sd)
		}
		return w
	}
	var cs []blockCase
	cs = append(cs, blockCase{"random 256x384", 256, 384, normal(256, 384, 0.02)})
	cs = append(cs, blockCase{"random partial edges 200x300", 200, 300, normal(200, 300, 1)})
	cs = append(cs, blockCase{"one row 1x129", 1, 129, normal(1, 129, 3)})
	cs = append(cs, blockCase{"one column 130x1", 130, 1, normal(130, 1, 3)})
	cs = append(cs, blockCase{"zeros 128x128", 128, 128, make([]float32, 128*128)})
	neg0 := make([]float32, 64*64)
	for i := range neg0 {
		neg0[i] = float32(math.Copysign(0, -1))
	}
	cs = append(cs, blockCase{"negative zeros 64x64", 64, 64, neg0})
	huge := normal(128, 256, 0.01)
	huge[77*256+3] = 3e38 // one block dominated by one value: the rest underflow
	huge[5*256+200] = -1e4
	cs = append(cs, blockCase{"one huge value", 128, 256, huge})
	// A block whose amax sets s so that the others land in the subnormal
	// codes: values from 2^-12 to 2^-6 of amax.
	sub := make([]float32, 128*128)
	for i := range sub {
		sub[i] = float32(math.Ldexp(1+rng.Float64(), -12+rng.IntN(7)) * float64(1-2*rng.IntN(2)))
	}
	sub[0] = 448
	cs = append(cs, blockCase{"subnormal codes", 128, 128, sub})
	// amax 448 makes s = 1, so every value is its own scaled value: put
	// them at midpoints between codes, and just off them.
	mid := make([]float32, 128*128)
	mid[0] = 448
	for i := 1; i < len(mid); i++ {
		c := uint8(rng.IntN(0x7E))
		m := float32((refValue(c) + refValue(c+1)) / 2)
		switch i % 3 {
		case 1:
			m = math.Nextafter32(m, 0)
		case 2:
			m = math.Nextafter32(m, 1000)
		}
		if rng.IntN(2) == 0 {
			m = -m
		}
		mid[i] = m
	}
	cs = append(cs, blockCase{"rounding midpoints", 128, 128, mid})
	// Weights far below the normal float32 range: scales would be
	// subnormal, so they are 1 and the codes zeros.
	tiny := normal(130, 130, 1e-39)
	tiny[1] = float32(math.Ldexp(1, -126) * 448) // a block with s = 2^-126 exactly
	cs = append(cs, blockCase{"tiny blocks", 130, 130, tiny})
	bad := normal(256, 256, 1)
	bad[3] = float32(math.NaN())
	bad[200] = float32(math.Inf(1))
	bad[130*256+5] = float32(math.Inf(-1))
	cs = append(cs, blockCase{"NaN and Inf poison their blocks", 256, 256, bad})
	return cs
}

func TestBlocksMatchReference(t *testing.T) {
	for _, c := range blockCases() {
		for _, d := range []dtype.DType{dtype.F32, dtype.BF16, dtype.F16} {
			t.Run(fmt.Sprintf("%s/%s", c.name, d), func(t *testing.T) {
				src, held := toBytes(c.w, d)
				wantCodes, wantScales := refQuantize(held, c.rows, c.cols)
				br, bc := ScaleShape(int64(c.rows), int64(c.cols))
				scales := make([]uint32, br*bc)
				if err := Scales(scales, src, d, c.cols); err != nil {
					t.Fatal(err)
				}
				for i := range scales {
					if scales[i] != wantScales[i] {
						t.Fatalf("scale %d = %#08x, want %#08x", i, scales[i], wantScales[i])
					}
				}
				codes := make([]byte, c.rows*c.cols)
				if err := Encode(codes, src, d, c.cols, 0, scales); err != nil {
					t.Fatal(err)
				}
				for i := range codes {
					if codes[i] != wantCodes[i] {
						t.Fatalf("code of element %d (%g) = %#02x, want %#02x", i, held[i], codes[i], wantCodes[i])
					}
				}
				// Any range of elements encodes as the whole does.
				es := d.Size()
				rng := rand.New(rand.NewPCG(uint64(len(codes)), 9))
				for range 20 {
					lo := rng.IntN(len(codes))
					hi := lo + rng.IntN(len(codes)-lo+1)
					part := make([]byte, hi-lo)
					br0 := lo / c.cols / 128
					if err := Encode(part, src[lo*es:hi*es], d, c.cols, int64(lo), scales[br0*int(bc):]); err != nil {
						t.Fatal(err)
					}
					if string(part) != string(codes[lo:hi]) {
						t.Fatalf("elements [%d, %d) encode differently on their own", lo, hi)
					}
				}
			})
		}
	}
}

// TestDequantizeBound checks that every finite weight comes back within
// the rounding bound of its code: half a step of the E4M3 grid at its
// scaled magnitude (2^-10 below 2^-6, 2^(e-4) in [2^e, 2^(e+1))), times s,
// plus the rounding of the product to BF16 when dequantizing to BF16.
func TestDequantizeBound(t *testing.T) {
	for _, c := range blockCases()[:4] {
		src, held := toBytes(c.w, dtype.BF16)
		br, bc := ScaleShape(int64(c.rows), int64(c.cols))
		scales := make([]uint32, br*bc)
		codes := make([]byte, c.rows*c.cols)
		if err := Scales(scales, src, dtype.BF16, c.cols); err != nil {
			t.Fatal(err)
		}
		if err := Encode(codes, src, dtype.BF16, c.cols, 0, scales); err != nil {
			t.Fatal(err)
		}
		f32 := make([]byte, 4*len(codes))
		bf := make([]byte, 2*len(codes))
		if err := Dequantize(f32, dtype.F32, codes, scales, c.rows, c.cols); err != nil {
			t.Fatal(err)
		}
		if err := Dequantize(bf, dtype.BF16, codes, scales, c.rows, c.cols); err != nil {
			t.Fatal(err)
		}
		for i, w := range held {
			s := float64(math.Float32frombits(scales[(i/c.cols/128)*int(bc)+(i%c.cols)/128]))
			x := math.Abs(float64(w)) / s
			step := math.Ldexp(1, -9)
			if x >= 0x1p-6 {
				_, e := math.Frexp(x)
				step = math.Ldexp(1, e-1-3)
			}
			// The float32 roundings of w/s and of code × s add at most a few
			// ulps of |w|.
			bound := step/2*s + math.Abs(float64(w))*0x1p-20
			got := float64(math.Float32frombits(binary.LittleEndian.Uint32(f32[4*i:])))
			if math.Abs(got-float64(w)) > bound {
				t.Fatalf("%s: element %d = %g came back as %g (bound %g)", c.name, i, w, got, bound)
			}
			gb := float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(bf[2*i:])) << 16))
			if math.Abs(gb-float64(w)) > bound+math.Abs(got)*0x1p-8 {
				t.Fatalf("%s: element %d = %g came back as BF16 %g", c.name, i, w, gb)
			}
		}
	}
}

func TestErrors(t *testing.T) {
	if err := Scales(make([]uint32, 1), make([]byte, 8), dtype.I32, 2); err == nil {
		t.Error("I32 source accepted")
	}
	if err := Scales(make([]uint32, 1), make([]byte, 6), dtype.BF16, 2); !errors.Is(err, ErrShape) {
		t.Errorf("ragged rows: %v", err)
	}
	if err := Scales(make([]uint32, 2), make([]byte, 8), dtype.BF16, 2); !errors.Is(err, ErrShape) {
		t.Errorf("wrong scale count: %v", err)
	}
	if err := Encode(make([]byte, 4), make([]byte, 6), dtype.BF16, 2, 0, []uint32{oneScale}); !errors.Is(err, ErrShape) {
		t.Errorf("short source: %v", err)
	}
	if err := Encode(make([]byte, 4), make([]byte, 8), dtype.BF16, 2, 254, []uint32{oneScale}); !errors.Is(err, ErrShape) {
		t.Errorf("range across block rows with one scale: %v", err)
	}
	if err := Dequantize(make([]byte, 8), dtype.F16, make([]byte, 4), []uint32{oneScale}, 2, 2); err == nil {
		t.Error("dequantize to F16 accepted")
	}
	if err := Dequantize(make([]byte, 6), dtype.BF16, make([]byte, 4), []uint32{oneScale}, 2, 2); !errors.Is(err, ErrShape) {
		t.Errorf("short destination: %v", err)
	}
}
