package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/quant"
)

// This file adds to the PTX interpreter (ptx_interp_test.go) the
// floating-point instructions of the quantize kernel's converter path,
// each executed as the PTX ISA defines it, written independently of
// package quant so that the kernel's tests compare two implementations:
//
//   - fma.rn.f32 d, a, b, c: a×b+c rounded once, to nearest even,
//     subnormals kept;
//   - cvt.rn.satfinite.e4m3x2.f32 d, a, b: a and b rounded to the nearest
//     float8_e4m3fn value, ties to even, magnitudes past 448 clamped to
//     448 (.satfinite), NaN to 0x7F; a's code in the upper byte of the
//     16-bit d, b's in the lower;
//   - cvt.f32.f16 d, a: the F16 in a, exactly;
//   - max.u16x2 d, a, b: the larger of each 16-bit half, unsigned.

// decodeF8 decodes in if it is one of the instructions above (ok), and
// refuses other forms of them.
func (k *ptxKernel) decodeF8(in *ptxInst, args []string) (ok bool, err error) {
	type opnd struct {
		role  int
		width uint
		kinds string // register kinds ptxas takes for the operand's type
	}
	var ops []opnd
	f32 := opnd{roleReg, 32, "fb"}
	switch in.op {
	case "fma.rn.f32":
		ops = []opnd{{roleDst, 32, "fb"}, f32, f32, f32}
	case "cvt.rn.satfinite.e4m3x2.f32":
		ops = []opnd{{roleDst, 16, "b"}, f32, f32}
	case "cvt.f32.f16":
		ops = []opnd{{roleDst, 32, "fb"}, {roleReg, 16, "b"}}
	case "max.u16x2":
		ops = []opnd{{roleDst, 32, "bu"}, {roleReg, 32, "bu"}, {roleSrc, 32, "bu"}}
	default:
		if strings.HasPrefix(in.op, "fma.") || strings.Contains(in.op, "x2") ||
			(strings.HasPrefix(in.op, "cvt.") && strings.ContainsAny(strings.Join(strings.Split(in.op, ".")[1:], "."), "fe")) {
			return true, fmt.Errorf("%s: of these the interpreter knows fma.rn.f32, cvt.rn.satfinite.e4m3x2.f32, cvt.f32.f16 and max.u16x2", in.op)
		}
		return false, nil
	}
	in.code, in.sub, in.width = cF8, in.op, 32
	if len(args) != len(ops) {
		return true, fmt.Errorf("%s takes %d operands, got %d", in.op, len(ops), len(args))
	}
	for i, o := range ops {
		a, err := k.operand(args[i], o.role, o.width, i == len(args)-1)
		if err != nil {
			return true, fmt.Errorf("operand %d (%s) of %s: %w", i+1, args[i], in.op, err)
		}
		if a.kind == argReg && !strings.ContainsRune(o.kinds, rune(k.regKind[a.reg])) {
			return true, fmt.Errorf("operand %d (%s) of %s: a .%c%d register, want .%s", i+1, a.text, in.op, k.regKind[a.reg], o.width,
				strings.Join(strings.Split(o.kinds, ""), "/."))
		}
		in.args = append(in.args, a)
	}
	return true, nil
}

// execF8 executes in (decoded by decodeF8).
func (k *ptxKernel) execF8(in *ptxInst, get func(*ptxArg) (uint64, error), put func(*ptxArg, uint64)) error {
	var v [3]uint64
	for i := range in.args[1:] {
		x, err := get(&in.args[i+1])
		if err != nil {
			return err
		}
		v[i] = x
	}
	var r uint64
	switch in.sub {
	case "fma.rn.f32":
		r = uint64(math.Float32bits(fma32(math.Float32frombits(uint32(v[0])), math.Float32frombits(uint32(v[1])), math.Float32frombits(uint32(v[2])))))
	case "cvt.rn.satfinite.e4m3x2.f32":
		r = uint64(e4m3Satfinite(uint32(v[0])))<<8 | uint64(e4m3Satfinite(uint32(v[1])))
	case "cvt.f32.f16":
		r = uint64(math.Float32bits(f16Value(uint16(v[0]))))
	case "max.u16x2":
		r = max(v[0]&0xFFFF, v[1]&0xFFFF) | max(v[0]>>16&0xFFFF, v[1]>>16&0xFFFF)<<16
	default:
		return fmt.Errorf("unknown instruction")
	}
	put(&in.args[0], r)
	return nil
}

// fma32 returns a×b+c rounded once to float32, to nearest even. The
// product of two float32s is exact in float64 and the sum's error is
// exact (TwoSum), so the float64 sum is rounded to float32 as the exact
// value would be: only where it lies exactly halfway between two float32s
// does the error decide, and the error's sign says which way.
func fma32(a, b, c float32) float32 {
	p, q := float64(a)*float64(b), float64(c)
	s := p + q
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return float32(s)
	}
	t := s - p
	e := (p - (s - t)) + (q - t)
	f := float32(s)
	if e == 0 || float64(f) == s {
		return f
	}
	lo, hi := f, f
	if float64(f) < s {
		hi = math.Nextafter32(f, float32(math.Inf(1)))
	} else {
		lo = math.Nextafter32(f, float32(math.Inf(-1)))
	}
	if s != (float64(lo)+float64(hi))/2 {
		return f
	}
	if e > 0 {
		return hi
	}
	return lo
}

// e4m3Satfinite returns the float8_e4m3fn code nearest to the float32 f,
// ties to even, magnitudes past 448 (infinities included) clamped to
// 448, NaN 0x7F: cvt.rn.satfinite of one lane.
func e4m3Satfinite(f uint32) uint8 {
	x := float64(math.Float32frombits(f))
	sign := uint8(f >> 24 & 0x80)
	ax := math.Abs(x)
	switch {
	case math.IsNaN(x):
		return 0x7F
	case ax >= 448:
		return sign | 0x7E
	case ax < 1.0/64:
		// Subnormal codes k·2^-9, k from 0 to 8 (8 is 2^-6, code 0x08).
		return sign | uint8(math.RoundToEven(ax*512))
	}
	_, exp := math.Frexp(ax) // ax = frac·2^exp, frac in [0.5, 1)
	e := exp - 1
	m := math.RoundToEven(math.Ldexp(ax, 3-e)) // 8 to 16
	if m == 16 {
		e, m = e+1, 8
	}
	return sign | uint8((e+7)<<3|(int(m)-8))
}

// f16Value returns the value of the F16 bits h as a float32 (exact).
func f16Value(h uint16) float32 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e, m := int(h>>10&31), float64(h&1023)
	switch {
	case e == 31 && m == 0:
		return float32(math.Inf(int(sign)))
	case e == 31:
		return float32(math.NaN())
	case e == 0:
		return float32(sign * math.Ldexp(m, -24))
	}
	return float32(sign * math.Ldexp(1024+m, e-25))
}

// TestPTXInterpreterFMA checks fma32 against exact arithmetic (math/big)
// on random bit patterns (subnormals, huge and tiny magnitudes) and on
// sums that land halfway between two float32s in float64 but not exactly.
func TestPTXInterpreterFMA(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	exact := func(a, b, c float32) float32 {
		x := new(big.Float).SetPrec(2000).SetFloat64(float64(a))
		x.Mul(x, new(big.Float).SetPrec(2000).SetFloat64(float64(b)))
		x.Add(x, new(big.Float).SetPrec(2000).SetFloat64(float64(c)))
		f, _ := x.Float32()
		if f == 0 { // the sign of an exact zero: +0 but for -0 + -0
			if x.Sign() == 0 && math.Signbit(float64(a*b)) && math.Signbit(float64(c)) {
				return float32(math.Copysign(0, -1))
			}
		}
		return f
	}
	finite := func(bits uint32) float32 {
		for {
			if f := math.Float32frombits(bits); !math.IsInf(float64(f), 0) && !math.IsNaN(float64(f)) {
				return f
			}
			bits = rng.Uint32()
		}
	}
	n := 0
	check := func(a, b, c float32) {
		n++
		got, want := fma32(a, b, c), exact(a, b, c)
		if math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("fma32(%g, %g, %g) = %#x, want %#x", a, b, c, math.Float32bits(got), math.Float32bits(want))
		}
	}
	for range 200000 {
		a, b, c := finite(rng.Uint32()), finite(rng.Uint32()), finite(rng.Uint32())
		if math.IsInf(float64(a)*float64(b), 0) || math.Abs(float64(a)*float64(b)) > math.MaxFloat32 {
			continue
		}
		check(a, b, c)
		// Near cancellation, and c a few binades off: the cases of the
		// quantize kernel's remainder and correction.
		check(a, b, -float32(float64(a)*float64(b)))
		check(a, b, float32(math.Ldexp(float64(c), -rng.IntN(60))))
	}
	// 1 + 2^-24 + 2^-60: the float64 sum is the midpoint 1 + 2^-24, the
	// exact value just above it, so the result is 1 + 2^-23.
	check(1+0x1p-24, 1, 0x1p-60)
	check(1+0x1p-24, 1, -0x1p-60)
	check(0x1p-149, 0.5, 0)
	check(0x1p-149, 1.5, 0)
	t.Logf("%d fused multiply-adds as exact arithmetic rounded once", n)
}

// TestPTXInterpreterE4M3 checks the converter's emulation against a
// nearest-code search (the rule's definition) over every float32 whose
// top 18 bits are each pattern once (the low 14 random), and at each code and midpoint; and against
// package quant (torch's rule, which does not saturate) wherever the
// magnitude is at most 448; and the F16 conversion against package cast
// over all F16s.
func TestPTXInterpreterE4M3(t *testing.T) {
	skipUnderRace(t)
	var values [127]float64
	for c := range values {
		values[c] = float64(math.Float32frombits(quant.DecodeE4M3(uint8(c))))
	}
	nearest := func(f uint32) uint8 {
		x := float64(math.Float32frombits(f))
		if math.IsNaN(x) {
			return 0x7F
		}
		best := 0
		for c := range values {
			d, bd := math.Abs(values[c]-math.Abs(x)), math.Abs(values[best]-math.Abs(x))
			if d < bd || (d == bd && c%2 == 0) {
				best = c
			}
		}
		return uint8(f>>24&0x80) | uint8(best)
	}
	rng := rand.New(rand.NewPCG(4, 3))
	check := func(f uint32) {
		got := e4m3Satfinite(f)
		if want := nearest(f); got != want {
			t.Fatalf("e4m3Satfinite(%#08x = %g) = %#02x, want %#02x", f, math.Float32frombits(f), got, want)
		}
		if a := f & 0x7FFFFFFF; a <= 0x43E00000 {
			if want := quant.EncodeE4M3(f); got != want {
				t.Fatalf("e4m3Satfinite(%#08x) = %#02x, package quant %#02x", f, got, want)
			}
		}
	}
	for hi := range uint32(1 << 18) {
		check(hi<<14 | rng.Uint32N(1<<14))
	}
	for c := range 126 {
		lo, hi := values[c], values[c+1]
		for _, x := range []float64{lo, (lo + hi) / 2, math.Nextafter(float64(float32((lo+hi)/2)), 0)} {
			check(math.Float32bits(float32(x)))
			check(math.Float32bits(float32(-x)))
		}
	}
	for h := range 1 << 16 {
		got, want := math.Float32bits(f16Value(uint16(h))), cast.F16ToF32(uint16(h))
		if got != want && !(math.IsNaN(float64(f16Value(uint16(h)))) && math.IsNaN(float64(math.Float32frombits(want)))) {
			t.Fatalf("f16Value(%#04x) = %#08x, package cast %#08x", h, got, want)
		}
	}
}

// TestPTXInterpreterF8Instructions runs the instructions through the
// interpreter: the converter's lane order (a in the upper byte, as the
// PTX ISA says; the values of published hardware runs: 0.40625 and 12.9
// give 0x2D55, -2.25 and 1.5 give 0xC13C), saturation, NaN, fma, the F16
// conversion, max.u16x2, and mov.b32 of 16-bit halves; then the forms
// the interpreter refuses.
func TestPTXInterpreterF8Instructions(t *testing.T) {
	bits := func(f float32) string { return fmt.Sprintf("0x%08X", math.Float32bits(f)) }
	cvt := func(a, b string) string {
		return "mov.b32 %r1, " + a + ";\nmov.b32 %r2, " + b + ";\ncvt.rn.satfinite.e4m3x2.f32 %h1, %r1, %r2;\ncvt.u64.u16 %rd1, %h1;"
	}
	cases := []struct {
		body string
		want uint64
	}{
		{cvt(bits(0.40625), bits(12.9)), 0x2D55},
		{cvt(bits(-2.25), bits(1.5)), 0xC13C},
		{cvt("0x7F800000", "0xC4000000"), 0x7EFE},    // +Inf and -512 saturate to ±448
		{cvt("0x7FC00000", "0x80000001"), 0x7F80},    // NaN; -2^-149 rounds to -0
		{cvt(bits(0x1p-10), bits(0x1.8p-9)), 0x0002}, // ties to even: 0 and 2·2^-9
		{cvt(bits(464), bits(0x1.ep-7)), 0x7E08},     // past 448: 448; 15·2^-10 rounds to 2^-6
		{"mov.b32 %r1, 0x3F800001;\nmov.b32 %r2, 0x3F7FFFFE;\nmov.b32 %r3, 0xBF800000;\nfma.rn.f32 %r1, %r1, %r2, %r3;\ncvt.u64.u32 %rd1, %r1;", 0xA8800000}, // (1+2^-23)(1-2^-23) - 1 = -2^-46, fused (mul then add give 0)
		{"mov.u32 %r1, 0x3C00;\ncvt.u16.u32 %h1, %r1;\ncvt.f32.f16 %r1, %h1;\ncvt.u64.u32 %rd1, %r1;", 0x3F800000},
		{"mov.u32 %r1, 0x8001;\ncvt.u16.u32 %h1, %r1;\ncvt.f32.f16 %r1, %h1;\ncvt.u64.u32 %rd1, %r1;", 0xB3800000},
		{"mov.b32 %r1, 0x7FFF0001;\nmov.b32 %r2, 0x00028000;\nmax.u16x2 %r1, %r1, %r2;\ncvt.u64.u32 %rd1, %r1;", 0x7FFF8000},
		{"mov.b32 %r1, 0x12345678;\nmov.b32 {%h0, %h1}, %r1;\nmov.b32 %r2, {%h1, %h0};\ncvt.u64.u32 %rd1, %r2;", 0x56781234},
	}
	for _, c := range cases {
		out, err := runSnippet(t, c.body+"\nld.param.u64 %rd3, [p];\nst.global.u64 [%rd3], %rd1;")
		if err != nil {
			t.Errorf("%q: %v", c.body, err)
			continue
		}
		if got := binary.LittleEndian.Uint64(out); got != c.want {
			t.Errorf("%q: %#x, want %#x", c.body, got, c.want)
		}
	}
	for body, want := range map[string]string{
		"cvt.rn.satfinite.e4m3x2.f32 %r1, %r2, %r3;":        "16-bit",
		"cvt.rn.e4m3x2.f32 %h1, %r2, %r3;":                  "the interpreter knows",
		"cvt.rn.satfinite.e5m2x2.f32 %h1, %r2, %r3;":        "the interpreter knows",
		".reg .u32 %u;\nfma.rn.f32 %r1, %u, %r2, %r3;":      "want .f/.b",
		"fma.rn.f32 %r1, %r2, %r3, 1;":                      "want a register",
		"fma.rz.f32 %r1, %r2, %r3, %r1;":                    "the interpreter knows",
		"cvt.f32.f16 %r1, %r2;":                             "16-bit",
		"cvt.rn.f16.f32 %h1, %r2;":                          "the interpreter knows",
		"max.s16x2 %r1, %r2, %r3;":                          "the interpreter knows",
		"max.u16x2 %rd1, %r2, %r3;":                         "64-bit register",
		"mov.b32 {%h0, %r1}, %r2;":                          "no declared 16-bit register",
		"fma.rn.f32 %r1, %r2, %r3;":                         "takes 4 operands",
		"cvt.rn.satfinite.e4m3x2.f32 %h1, %r2, 0x3F800000;": "want a register",
	} {
		if _, err := compilePTX("snippet.ptx", ptxSnippet(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error saying %q", body, err, want)
		}
	}
}
