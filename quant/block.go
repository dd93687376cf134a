package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
)

// Block is the side of a scaling block: 128×128 elements share one scale.
const Block = 128

// NaNScale is the float32 bits of the scale of a block that holds a NaN
// or ±Inf.
const NaNScale = 0x7FC00000

// minScale is the float32 bits of 2^-126, the smallest normal float32:
// a block's scale below it is replaced by 1 (oneScale).
const (
	minScale = 0x00800000
	oneScale = 0x3F800000
)

// ErrShape is matched by the errors of the functions given buffers or
// shapes that do not fit each other.
var ErrShape = errors.New("quant: shape mismatch")

// ScaleShape returns the shape of the scales of a [rows, cols] weight:
// [ceil(rows/128), ceil(cols/128)].
func ScaleShape(rows, cols int64) (int64, int64) {
	return (rows + Block - 1) / Block, (cols + Block - 1) / Block
}

// Sources reports whether weights of dtype d can be quantized: F32, BF16
// and F16.
func Sources(d dtype.DType) bool {
	return d == dtype.F32 || d == dtype.BF16 || d == dtype.F16
}

// ScaleOf returns the float32 bits of the scale of a block whose largest
// magnitude has the float32 bits amax (sign clear): NaNScale when amax is
// Inf or NaN, amax/448 rounded to nearest even, or 1 when that is below
// 2^-126 (amax = 0 included).
func ScaleOf(amax uint32) uint32 {
	if amax >= 0x7F800000 {
		return NaNScale
	}
	s := math.Float32bits(math.Float32frombits(amax) / MaxE4M3)
	if s < minScale {
		return oneScale
	}
	return s
}

// EncodeScaled returns the code of the float32 with bits w in a block of
// scale bits s: EncodeE4M3(w / s), the division in float32, or NaNE4M3
// when s is NaNScale.
func EncodeScaled(w, s uint32) uint8 {
	if s == NaNScale {
		return NaNE4M3
	}
	return EncodeE4M3(math.Float32bits(math.Float32frombits(w) / math.Float32frombits(s)))
}

// widen returns the float32 bits of element i of src, of dtype d.
func widen(src []byte, d dtype.DType, i int) uint32 {
	switch d {
	case dtype.BF16:
		return uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16
	case dtype.F16:
		return cast.F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	default:
		return binary.LittleEndian.Uint32(src[4*i:])
	}
}

// amax folds the magnitude bits of element bits f into m: the ordering of
// non-negative float32 bits as integers is that of their values, and any
// NaN or Inf lands at or above 0x7F800000.
func amax(m, f uint32) uint32 { return max(m, f&0x7FFFFFFF) }

// FoldAmax folds the magnitudes of the elements [first, first+n) (flat,
// row-major indices) of a weight with cols columns, whose bytes, of dtype
// from, are src (n elements), into m, the running amax bits of each
// column block (len(m) = ceil(cols/128)): m[c/128] = max(m[c/128], |w|).
// The rows must all lie in one block row for m to be that block row's.
func FoldAmax(m []uint32, src []byte, from dtype.DType, cols int, first int64) error {
	if !Sources(from) {
		return fmt.Errorf("quant: cannot quantize %s (F32, BF16 and F16 can be)", from)
	}
	es := from.Size()
	if cols <= 0 || first < 0 || len(src)%es != 0 || len(m) != (cols+Block-1)/Block {
		return fmt.Errorf("%w: %d bytes of %s at element %d of %d columns, %d column blocks", ErrShape, len(src), from, first, cols, len(m))
	}
	c := int(first % int64(cols))
	for i := range len(src) / es {
		j := c / Block
		m[j] = amax(m[j], widen(src, from, i))
		if c++; c == cols {
			c = 0
		}
	}
	return nil
}

// Scales computes the scale bits of every block of the rows held in src:
// whole rows of a weight with cols columns, of dtype from, starting at a
// row that is a multiple of 128, so that src holds whole blocks (the last
// block row may be partial). dst receives ceil(n/128) × ceil(cols/128)
// scales, row-major, where n is the number of rows in src.
func Scales(dst []uint32, src []byte, from dtype.DType, cols int) error {
	if !Sources(from) {
		return fmt.Errorf("quant: cannot quantize %s (F32, BF16 and F16 can be)", from)
	}
	es := from.Size()
	if cols <= 0 || len(src)%(es*cols) != 0 {
		return fmt.Errorf("%w: %d bytes are not whole rows of %d %s elements", ErrShape, len(src), cols, from)
	}
	rows := len(src) / (es * cols)
	br, bc := ScaleShape(int64(rows), int64(cols))
	if int64(len(dst)) != br*bc {
		return fmt.Errorf("%w: %d rows of %d columns have %d×%d blocks, not %d", ErrShape, rows, cols, br, bc, len(dst))
	}
	nbc := int(bc)
	m := make([]uint32, nbc)
	stripe := Block * cols * es
	for r0 := 0; r0 < rows; r0 += Block {
		clear(m)
		end := min(len(src), (r0/Block+1)*stripe)
		if err := FoldAmax(m, src[r0*cols*es:end], from, cols, int64(r0)*int64(cols)); err != nil {
			return err
		}
		for j, v := range m {
			dst[r0/Block*nbc+j] = ScaleOf(v)
		}
	}
	return nil
}

// Encode writes the codes of the elements [first, first+len(dst)) (flat,
// row-major indices) of a weight with cols columns, whose bytes, of dtype
// from, are src (exactly len(dst) elements, element first at src[0]).
// scales are the scale bits of the weight's blocks, row-major, from the
// block row of element first on: the scale of element (r, c) is
// scales[(r/128 - r0/128)·ceil(cols/128) + c/128], r0 being first's row.
func Encode(dst []byte, src []byte, from dtype.DType, cols int, first int64, scales []uint32) error {
	if !Sources(from) {
		return fmt.Errorf("quant: cannot quantize %s (F32, BF16 and F16 can be)", from)
	}
	if cols <= 0 || first < 0 || len(src) != len(dst)*from.Size() {
		return fmt.Errorf("%w: %d codes from %d bytes of %s (columns %d, first element %d)", ErrShape, len(dst), len(src), from, cols, first)
	}
	if len(dst) == 0 {
		return nil
	}
	nbc := (cols + Block - 1) / Block
	br0 := first / int64(cols) / Block
	last := first + int64(len(dst)) - 1
	if need := (last/int64(cols)/Block - br0 + 1) * int64(nbc); int64(len(scales)) < need {
		return fmt.Errorf("%w: elements [%d, %d] of %d columns need %d scales, got %d", ErrShape, first, last, cols, need, len(scales))
	}
	r, c := int(first/int64(cols)), int(first%int64(cols))
	row := scales[(int64(r)/Block-br0)*int64(nbc):]
	for i := range dst {
		dst[i] = EncodeScaled(widen(src, from, i), row[c/Block])
		if c++; c == cols {
			c = 0
			if r++; r%Block == 0 {
				row = row[nbc:]
			}
		}
	}
	return nil
}

// Dequantize writes code × scale, computed in float32, for every element
// of a [rows, cols] weight whose codes (row-major) and scale bits are
// given, into dst as to: F32, or BF16 rounded as package cast rounds.
func Dequantize(dst []byte, to dtype.DType, codes []byte, scales []uint32, rows, cols int) error {
	if to != dtype.F32 && to != dtype.BF16 {
		return fmt.Errorf("quant: dequantizes to F32 or BF16, not %s", to)
	}
	br, bc := ScaleShape(int64(rows), int64(cols))
	if rows < 0 || cols < 0 || len(codes) != rows*cols || int64(len(scales)) != br*bc || len(dst) != rows*cols*to.Size() {
		return fmt.Errorf("%w: a [%d, %d] weight has %d codes and %d×%d scales, and dequantizes to %d bytes of %s; got %d codes, %d scales, %d bytes",
			ErrShape, rows, cols, rows*cols, br, bc, rows*cols*to.Size(), to, len(codes), len(scales), len(dst))
	}
	nbc := int(bc)
	for r := range rows {
		srow := scales[r/Block*nbc:]
		for c := range cols {
			i := r*cols + c
			v := math.Float32bits(decodeTable[codes[i]] * math.Float32frombits(srow[c/Block]))
			if to == dtype.F32 {
				binary.LittleEndian.PutUint32(dst[4*i:], v)
			} else {
				binary.LittleEndian.PutUint16(dst[2*i:], cast.F32ToBF16(v))
			}
		}
	}
	return nil
}
