package gpu

import (
	"flag"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/quant"
)

var quantExhaustive = flag.Bool("quant-exhaustive", false,
	"TestQuantConvDivision: every F16 (and so BF16) mantissa against every float32 scale mantissa (minutes)")

// quantConvQuotient is x / s as quant.ptx's vector path computes it: from
// y, 1/s rounded to nearest, q0 = x*y, the remainder r = x - q0*s (fused,
// exact where it matters) and q0 + r*y (fused).
func quantConvQuotient(x, s float32) float32 {
	y := 1 / s
	q0 := x * y
	r := fma32(q0, -s, x)
	return fma32(r, y, q0)
}

// quantConvCode is the code quant.ptx's vector path gives the element of
// float32 bits x in a block of scale bits s (not NaN): the quotient
// converted with saturation, the element's sign ORed in.
func quantConvCode(x, s uint32) uint8 {
	q := quantConvQuotient(math.Float32frombits(x), math.Float32frombits(s))
	return e4m3Satfinite(math.Float32bits(q)) | uint8(x>>24&0x80)
}

// TestQuantConvDivision checks the arithmetic of quant.ptx's vector path
// (the GPU's operations emulated as the PTX ISA defines them: fma32,
// e4m3Satfinite) against package quant's division and encoding:
//
//   - the quotient is the correctly rounded x / s for F16 mantissas (which
//     include BF16's) against float32 scale mantissas, with both in [1, 2):
//     the computation scales with the operands' exponents wherever no
//     step leaves the normal range, so this covers every such pair. By
//     default 4096 scale mantissas at random; with -quant-exhaustive all
//     2^23 of them (2^33 pairs, minutes; run and passed when the path was
//     written);
//   - the codes equal quant.EncodeScaled for random blocks of BF16 and
//     F16, whose scales (from their amax, quant.ScaleOf) run from 2^-90,
//     the smallest the vector path takes, to the largest a BF16 amax
//     gives, with elements of every magnitude up to the amax (float32
//     subnormals, ±0 and the amax itself included).
func TestQuantConvDivision(t *testing.T) {
	rng := rand.New(rand.NewPCG(90, 448))
	scales := make([]uint32, 0, 1<<12)
	if *quantExhaustive {
		scales = make([]uint32, 0, 1<<23)
		for m := range uint32(1 << 23) {
			scales = append(scales, m)
		}
	} else {
		scales = append(scales, 0, 0x7FFFFF, 0x400000)
		for len(scales) < cap(scales) {
			scales = append(scales, rng.Uint32N(1<<23))
		}
	}
	bad := 0
	for _, sm := range scales {
		s := math.Float32frombits(0x3F800000 | sm)
		for xm := range uint32(1 << 10) {
			x := math.Float32frombits(0x3F800000 | xm<<13)
			if got, want := quantConvQuotient(x, s), x/s; got != want {
				if bad++; bad < 5 {
					t.Errorf("%g / %g: %#08x, want %#08x", x, s, math.Float32bits(got), math.Float32bits(want))
				}
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d quotients differ", bad)
	}
	t.Logf("%d scale mantissas × 1024 element mantissas: every quotient correctly rounded", len(scales))

	// Blocks: amax from 448·2^-90 (scale 2^-90) to the largest finite BF16.
	checked := 0
	for range 2000 {
		e := -83 + rng.IntN(83+128) // the amax's exponent: 448·2^-90 is 1.75·2^-82
		amax := math.Float32bits(float32(math.Ldexp(1+rng.Float64(), e))) &^ 0xFFFF
		f16 := e < 16 && rng.IntN(2) == 0
		if f16 {
			amax = cast.F16ToF32(cast.F32ToF16(amax))
		}
		if amax >= 0x7F800000 {
			continue
		}
		s := quant.ScaleOf(amax)
		if s < 0x12800000 {
			continue // the scalar path's
		}
		for i := range 200 {
			// Magnitudes from the amax down to far below its smallest
			// nonzero code, some of them subnormal float32s.
			x := math.Float32bits(float32(math.Ldexp(rng.Float64(), -rng.IntN(40)) * float64(math.Float32frombits(amax))))
			switch i {
			case 0:
				x = amax
			case 1:
				x = 0
			}
			if f16 {
				x = cast.F16ToF32(cast.F32ToF16(x))
			} else {
				x &^= 0xFFFF // a BF16
			}
			x |= uint32(rng.IntN(2)) << 31
			if got, want := quantConvCode(x, s), quant.EncodeScaled(x, s); got != want {
				t.Fatalf("x %#08x in a block of amax %#08x, scale %#08x: code %#02x, want %#02x", x, amax, s, got, want)
			}
			checked++
		}
	}
	t.Logf("%d elements of random blocks: codes as package quant's", checked)
}
