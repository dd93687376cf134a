package cast

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"

	"github.com/weightcast/weightcast/dtype"
)

// Errors returned by Convert, wrapped with the details.
var (
	// ErrUnsupported: no conversion between these two dtypes.
	ErrUnsupported = errors.New("unsupported conversion")
	// ErrLength: a buffer whose length does not fit the element count.
	ErrLength = errors.New("buffer length mismatch")
)

// Supported reports whether Convert converts src elements into dst
// elements: F32→BF16, F32→F16, BF16→F16, F16→BF16, the exact widenings
// BF16→F32 and F16→F32, and the identity on F32, BF16 and F16.
func Supported(src, dst dtype.DType) bool {
	return kernel(src, dst) != nil
}

type kernelFunc func(dst, src []byte)

func kernel(src, dst dtype.DType) kernelFunc {
	switch {
	case src == dst && (src == dtype.F32 || src == dtype.BF16 || src == dtype.F16):
		return func(dst, src []byte) { copy(dst, src) }
	case src == dtype.F32 && dst == dtype.BF16:
		return f32ToBF16
	case src == dtype.F32 && dst == dtype.F16:
		return f32ToF16
	case src == dtype.BF16 && dst == dtype.F16:
		return bf16ToF16
	case src == dtype.F16 && dst == dtype.BF16:
		return f16ToBF16
	case src == dtype.BF16 && dst == dtype.F32:
		return bf16ToF32
	case src == dtype.F16 && dst == dtype.F32:
		return f16ToF32
	}
	return nil
}

// Convert converts the little-endian elements of src, of type srcType, into
// dst as dstType. len(src) must be a whole number n of srcType elements and
// len(dst) exactly n dstType elements. dst and src must not overlap, except
// that a conversion to a type no wider than the source may run in place
// (dst starting at src's first byte).
func Convert(dst []byte, dstType dtype.DType, src []byte, srcType dtype.DType) error {
	k := kernel(srcType, dstType)
	if k == nil {
		return fmt.Errorf("cast: %w: %s to %s (supported: F32→BF16, F32→F16, BF16→F16, F16→BF16, BF16→F32, F16→F32 and identity on F32, BF16, F16)",
			ErrUnsupported, srcType, dstType)
	}
	ss, ds := srcType.Size(), dstType.Size()
	if len(src)%ss != 0 {
		return fmt.Errorf("cast: %w: %s source of %d bytes is not a whole number of %d-byte elements", ErrLength, srcType, len(src), ss)
	}
	n := len(src) / ss
	if len(dst) != n*ds {
		return fmt.Errorf("cast: %w: %d %s elements need a %s destination of %d bytes, got %d", ErrLength, n, srcType, dstType, n*ds, len(dst))
	}
	k(dst, src)
	return nil
}

// F32ToBF16 rounds the float32 with bits f to bfloat16, to nearest with
// ties to even, exactly as PyTorch's c10::detail::round_to_nearest_even:
// every NaN becomes 0x7FC0, values past the largest bfloat16 round to ±Inf,
// subnormals round on their bits like any other value.
func F32ToBF16(f uint32) uint16 {
	if f&0x7FFFFFFF > 0x7F800000 {
		return 0x7FC0
	}
	return uint16((f + 0x7FFF + (f>>16)&1) >> 16)
}

// F32ToF16 rounds the float32 with bits f to IEEE half precision, to
// nearest with ties to even, mirroring PyTorch's
// c10::detail::fp16_ieee_from_fp32_value bit for bit: a NaN becomes
// sign | 0x7E00, values at or past 65520 in magnitude become ±Inf, results
// below 2^-14 are correctly rounded subnormals.
func F32ToF16(f uint32) uint16 {
	// base is 4|f|, except that magnitudes a half cannot hold overflow to
	// Inf on the way (the float32() conversions keep each step rounded to
	// float32 and forbid fused multiply-adds).
	base := float32(float32(math.Float32frombits(f&0x7FFFFFFF)*0x1p112) * 0x1p-110)
	shl1 := f + f
	// Adding 2^(e+15), e being f's exponent but at least -14, leaves the
	// sum with the ulp of a half of base's size, so the FPU's own
	// round-to-nearest-even does the rounding, subnormal results included;
	// the half's exponent and mantissa are then read off the sum's bits.
	b := math.Float32bits(float32(math.Float32frombits(max(shl1&0xFF000000, 0x71000000)>>1+0x07800000) + base))
	nonsign := (b>>13)&0x7C00 + b&0x0FFF
	if shl1 > 0xFF000000 { // NaN
		nonsign = 0x7E00
	}
	return uint16((f&0x80000000)>>16 | nonsign)
}

// F16ToF32 widens the half with bits h to float32 exactly (c10's
// fp16_ieee_to_fp32_bits): subnormals are normalized, NaN payloads are
// shifted into place and kept.
func F16ToF32(h uint16) uint32 {
	w := uint32(h) << 16
	sign := w & 0x80000000
	nonsign := w & 0x7FFFFFFF
	renorm := uint32(bits.LeadingZeros32(nonsign))
	if renorm > 5 {
		renorm -= 5
	} else {
		renorm = 0
	}
	infNaN := uint32(int32(nonsign+0x04000000)>>8) & 0x7F800000
	zero := uint32(int32(nonsign-1) >> 31)
	return sign | ((nonsign<<renorm>>3)+((0x70-renorm)<<23)|infNaN)&^zero
}

// BF16ToF32 widens the bfloat16 with bits b to float32 exactly.
func BF16ToF32(b uint16) uint32 { return uint32(b) << 16 }

// BF16ToF16 converts through the exact float32 value: F32ToF16(BF16ToF32(b)).
func BF16ToF16(b uint16) uint16 { return F32ToF16(BF16ToF32(b)) }

// F16ToBF16 converts through the exact float32 value: F32ToBF16(F16ToF32(h)).
func F16ToBF16(h uint16) uint16 { return F32ToBF16(F16ToF32(h)) }

var le = binary.LittleEndian

func f32ToBF16(dst, src []byte) {
	for len(src) >= 16 && len(dst) >= 8 {
		a, b, c, d := le.Uint32(src), le.Uint32(src[4:]), le.Uint32(src[8:]), le.Uint32(src[12:])
		le.PutUint64(dst, uint64(F32ToBF16(a))|uint64(F32ToBF16(b))<<16|uint64(F32ToBF16(c))<<32|uint64(F32ToBF16(d))<<48)
		src, dst = src[16:], dst[8:]
	}
	for len(src) >= 4 && len(dst) >= 2 {
		le.PutUint16(dst, F32ToBF16(le.Uint32(src)))
		src, dst = src[4:], dst[2:]
	}
}

func f32ToF16(dst, src []byte) {
	for len(src) >= 16 && len(dst) >= 8 {
		a, b, c, d := le.Uint32(src), le.Uint32(src[4:]), le.Uint32(src[8:]), le.Uint32(src[12:])
		le.PutUint64(dst, uint64(F32ToF16(a))|uint64(F32ToF16(b))<<16|uint64(F32ToF16(c))<<32|uint64(F32ToF16(d))<<48)
		src, dst = src[16:], dst[8:]
	}
	for len(src) >= 4 && len(dst) >= 2 {
		le.PutUint16(dst, F32ToF16(le.Uint32(src)))
		src, dst = src[4:], dst[2:]
	}
}

// Lookup tables for the conversions from 16-bit types: each is a pure
// function of 65,536 inputs, built once from the element functions.
var (
	bf16ToF16Table = sync.OnceValue(func() *[1 << 16]uint16 { return table16(BF16ToF16) })
	f16ToBF16Table = sync.OnceValue(func() *[1 << 16]uint16 { return table16(F16ToBF16) })
	f16ToF32Table  = sync.OnceValue(func() *[1 << 16]uint32 {
		var t [1 << 16]uint32
		for i := range t {
			t[i] = F16ToF32(uint16(i))
		}
		return &t
	})
)

func table16(fn func(uint16) uint16) *[1 << 16]uint16 {
	var t [1 << 16]uint16
	for i := range t {
		t[i] = fn(uint16(i))
	}
	return &t
}

func lookup16(dst, src []byte, t *[1 << 16]uint16) {
	for len(src) >= 8 && len(dst) >= 8 {
		v := le.Uint64(src)
		le.PutUint64(dst, uint64(t[uint16(v)])|uint64(t[uint16(v>>16)])<<16|uint64(t[uint16(v>>32)])<<32|uint64(t[uint16(v>>48)])<<48)
		src, dst = src[8:], dst[8:]
	}
	for len(src) >= 2 && len(dst) >= 2 {
		le.PutUint16(dst, t[le.Uint16(src)])
		src, dst = src[2:], dst[2:]
	}
}

func bf16ToF16(dst, src []byte) { lookup16(dst, src, bf16ToF16Table()) }

func f16ToBF16(dst, src []byte) { lookup16(dst, src, f16ToBF16Table()) }

func bf16ToF32(dst, src []byte) {
	for len(src) >= 2 && len(dst) >= 4 {
		le.PutUint32(dst, BF16ToF32(le.Uint16(src)))
		src, dst = src[2:], dst[4:]
	}
}

func f16ToF32(dst, src []byte) {
	t := f16ToF32Table()
	for len(src) >= 2 && len(dst) >= 4 {
		le.PutUint32(dst, t[le.Uint16(src)])
		src, dst = src[2:], dst[4:]
	}
}
