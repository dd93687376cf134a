package quant

import (
	"math"
	"math/rand/v2"
	"testing"
)

// refValue decodes a code from the format's definition, as float64.
func refValue(c uint8) float64 {
	e, m := int(c>>3&0xF), float64(c&7)
	var v float64
	switch {
	case e == 0xF && m == 7:
		return math.NaN()
	case e == 0:
		v = math.Ldexp(m, -9) // subnormal: m/8 · 2^(1-7)
	default:
		v = math.Ldexp(8+m, e-10) // (1 + m/8) · 2^(e-7)
	}
	if c&0x80 != 0 {
		v = -v
	}
	return v
}

// refEncode rounds x to float8_e4m3fn by searching the code whose value
// is nearest, ties to the even code, with 480 (the value 0x7F would have
// if E4M3FN did not spend it on NaN) as the one past 448: what rounds to
// it, or lies beyond it, is NaN, as in torch's non-saturating conversion.
func refEncode(x float32) uint8 {
	v := float64(x)
	sign := uint8(0)
	if math.Signbit(v) {
		sign = 0x80
	}
	if math.IsNaN(v) {
		return sign | 0x7F
	}
	a := math.Abs(v)
	best, bestD := -1, math.Inf(1)
	for c := 0; c <= 0x7F; c++ {
		cv := 480.0
		if c < 0x7F {
			cv = refValue(uint8(c))
		}
		d := math.Abs(a - cv)
		if d < bestD || (d == bestD && c%2 == 0) {
			best, bestD = c, d
		}
	}
	if a > 480 {
		best = 0x7F
	}
	return sign | uint8(best)
}

func TestEveryCodeDecodesAndEncodesBack(t *testing.T) {
	for i := range 256 {
		c := uint8(i)
		f := DecodeE4M3(c)
		v, want := float64(math.Float32frombits(f)), refValue(c)
		if math.IsNaN(want) {
			if !math.IsNaN(v) || f != uint32(c&0x80)<<24|0x7FC00000 {
				t.Fatalf("DecodeE4M3(%#02x) = %#08x, want a quiet NaN of its sign", c, f)
			}
		} else if v != want || math.Signbit(v) != math.Signbit(want) {
			t.Fatalf("DecodeE4M3(%#02x) = %v, want %v", c, v, want)
		}
		if got := EncodeE4M3(f); got != c {
			t.Fatalf("EncodeE4M3(DecodeE4M3(%#02x) = %#08x) = %#02x", c, f, got)
		}
		if got := refEncode(math.Float32frombits(f)); got != c {
			t.Fatalf("the reference encodes %#02x's value back to %#02x", c, got)
		}
	}
	if DecodeE4M3(0x7E) != math.Float32bits(448) || DecodeE4M3(0x01) != math.Float32bits(0x1p-9) || DecodeE4M3(0x08) != math.Float32bits(0x1p-6) {
		t.Fatal("448, 2^-9 or 2^-6 decode wrong")
	}
}

func TestEncodeTable(t *testing.T) {
	f := func(v float32) uint32 { return math.Float32bits(v) }
	cases := []struct {
		name string
		in   uint32
		want uint8
	}{
		{"one", f(1), 0x38},
		{"-one", f(-1), 0xB8},
		{"+0", 0, 0x00},
		{"-0", 0x80000000, 0x80},
		{"448", f(448), 0x7E},
		{"just below 464 rounds to 448", f(463.99997), 0x7E},
		{"464 ties to even 448", f(464), 0x7E},
		{"just above 464 is NaN (no saturation)", f(464.00003), 0x7F},
		{"-500 is -NaN", f(-500), 0xFF},
		{"480 is NaN", f(480), 0x7F},
		{"+Inf is NaN", 0x7F800000, 0x7F},
		{"-Inf is -NaN", 0xFF800000, 0xFF},
		{"NaN", 0x7FC00000, 0x7F},
		{"-NaN", 0xFFC00001, 0xFF},
		{"1.0625 ties to even 1", f(1.0625), 0x38},
		{"1.1875 ties to even 1.25", f(1.1875), 0x3A},
		{"min normal 2^-6", f(0x1p-6), 0x08},
		{"largest subnormal 7·2^-9", f(7 * 0x1p-9), 0x07},
		{"7.5·2^-9 ties to even min normal", f(7.5 * 0x1p-9), 0x08},
		{"2^-10 ties to even 0", f(0x1p-10), 0x00},
		{"just above 2^-10 is 2^-9", f(0x1p-10 + 0x1p-30), 0x01},
		{"1.5·2^-9 ties to even 2·2^-9", f(1.5 * 0x1p-9), 0x02},
		{"2.5·2^-9 ties to even 2·2^-9", f(2.5 * 0x1p-9), 0x02},
		{"-2^-9", f(-0x1p-9), 0x81},
		{"f32 subnormal to 0", 0x00000001, 0x00},
		{"-f32 subnormal to -0", 0x807FFFFF, 0x80},
	}
	for _, c := range cases {
		if got := EncodeE4M3(c.in); got != c.want {
			t.Errorf("%s: EncodeE4M3(%#08x) = %#02x, want %#02x", c.name, c.in, got, c.want)
		}
		if got := refEncode(math.Float32frombits(c.in)); got != c.want {
			t.Errorf("%s: the reference gives %#02x, want %#02x", c.name, got, c.want)
		}
	}
}

// TestEncodeMidpoints checks both neighbours of every midpoint between
// consecutive codes, and the midpoints themselves, against the reference.
func TestEncodeMidpoints(t *testing.T) {
	for c := 0; c < 0x7E; c++ {
		lo, hi := refValue(uint8(c)), refValue(uint8(c+1))
		mid := math.Float32bits(float32((lo + hi) / 2)) // exact: few mantissa bits
		for _, u := range []uint32{mid - 1, mid, mid + 1} {
			for _, s := range []uint32{0, 0x80000000} {
				in := u | s
				if got, want := EncodeE4M3(in), refEncode(math.Float32frombits(in)); got != want {
					t.Fatalf("midpoint of %#02x and %#02x: EncodeE4M3(%#08x) = %#02x, want %#02x", c, c+1, in, got, want)
				}
			}
		}
	}
}

// TestEncodeMatchesReference compares the fast encoder with the reference
// on every float32 of magnitude below 512 whose low 12 mantissa bits are
// patterns that straddle the rounding boundaries, and on random bits.
func TestEncodeMatchesReference(t *testing.T) {
	check := func(u uint32) {
		if got, want := EncodeE4M3(u), refEncode(math.Float32frombits(u)); got != want {
			t.Fatalf("EncodeE4M3(%#08x = %g) = %#02x, want %#02x", u, math.Float32frombits(u), got, want)
		}
	}
	// Every exponent up to 512, every top 8 mantissa bits (the 3 kept,
	// the rounding bit and 4 more), and the low bits zero (a tie where the
	// rounding bit is the only one set), one or all ones.
	for e := uint32(0); e <= 136; e++ {
		for top := uint32(0); top < 256; top++ {
			for _, low := range []uint32{0, 1, 0x7FFF} {
				u := e<<23 | top<<15 | low
				check(u)
				check(u | 0x80000000)
			}
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	n := 50000
	if testing.Short() {
		n = 5000
	}
	for range n {
		check(rng.Uint32())
		check(rng.Uint32()&0x807FFFFF | (110+rng.Uint32N(30))<<23) // 2^-17 .. 2^12
	}
}
