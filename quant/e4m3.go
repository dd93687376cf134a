package quant

import "math"

// MaxE4M3 is the largest finite float8_e4m3fn value.
const MaxE4M3 = 448

// NaNE4M3 is the code of a NaN (0xFF is the other).
const NaNE4M3 = 0x7F

// EncodeE4M3 rounds the float32 with bits f to float8_e4m3fn as PyTorch's
// c10::detail::fp8e4m3fn_from_fp32_value does: to nearest, ties to even;
// magnitudes below 2^-6 to correctly rounded subnormal codes; magnitudes
// above 464 (the midpoint between 448 and the 480 that E4M3FN spends on
// NaN), ±Inf and NaN to NaN with f's sign (0x7F or 0xFF). There is no
// saturation. -0 gives 0x80.
func EncodeE4M3(f uint32) uint8 {
	sign := uint8(f>>24) & 0x80
	a := f & 0x7FFFFFFF
	switch {
	case a >= 0x43F00000: // 480 and beyond, Inf, NaN
		return sign | NaNE4M3
	case a < 0x3C800000: // below 2^-6: subnormal codes
		// magic is 2^14, whose float32 ulp is 2^-9, the subnormal codes'
		// step: adding it lets the FPU's own round-to-nearest-even put |x|
		// on that grid, and the code is the sum's bits past magic's.
		const magic = 141 << 23
		s := math.Float32bits(math.Float32frombits(a) + math.Float32frombits(magic))
		return sign | uint8(s-magic)
	default:
		// Rebias the exponent (127 → 7) and round the 23-bit mantissa to
		// 3 bits: add just under half an ulp, plus one when the kept
		// mantissa is odd, and keep the top bits.
		a += 0xC4000000 + 0x7FFFF + (a>>20)&1 // 0xC4000000 is -120<<23 modulo 2^32
		return sign | uint8(a>>20)
	}
}

// DecodeE4M3 returns the float32 bits of the float8_e4m3fn code c (exact;
// both NaN codes give a quiet NaN with c's sign, 0x7FC00000 or 0xFFC00000).
func DecodeE4M3(c uint8) uint32 {
	sign := uint32(c&0x80) << 24
	e, m := uint32(c>>3)&0xF, uint32(c&7)
	switch {
	case e == 0xF && m == 7:
		return sign | 0x7FC00000
	case e == 0:
		// m · 2^-9: a float32 normal number for every m > 0.
		if m == 0 {
			return sign
		}
		return sign | math.Float32bits(float32(m)*0x1p-9)
	default:
		return sign | (e+120)<<23 | m<<20
	}
}

// decodeTable holds DecodeE4M3 of every code, as float32 values.
var decodeTable = func() (t [256]float32) {
	for i := range t {
		t[i] = math.Float32frombits(DecodeE4M3(uint8(i)))
	}
	return t
}()
