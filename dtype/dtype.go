package dtype

import (
	"fmt"
	"strings"
)

// DType is a tensor element type, spelled as in the safetensors header
// ("BF16", "F32", ...). The zero value is invalid.
type DType uint8

// The element types safetensors defines.
const (
	Invalid DType = iota
	BOOL
	U8
	I8
	I16
	U16
	I32
	U32
	I64
	U64
	F8E4M3
	F8E5M2
	F16
	BF16
	F32
	F64
	numDTypes
)

var names = [numDTypes]string{
	Invalid: "INVALID",
	BOOL:    "BOOL",
	U8:      "U8",
	I8:      "I8",
	I16:     "I16",
	U16:     "U16",
	I32:     "I32",
	U32:     "U32",
	I64:     "I64",
	U64:     "U64",
	F8E4M3:  "F8_E4M3",
	F8E5M2:  "F8_E5M2",
	F16:     "F16",
	BF16:    "BF16",
	F32:     "F32",
	F64:     "F64",
}

var sizes = [numDTypes]int{
	BOOL: 1, U8: 1, I8: 1, I16: 2, U16: 2, I32: 4, U32: 4, I64: 8, U64: 8,
	F8E4M3: 1, F8E5M2: 1, F16: 2, BF16: 2, F32: 4, F64: 8,
}

// All lists every valid DType, in declaration order.
func All() []DType {
	out := make([]DType, 0, numDTypes-1)
	for d := BOOL; d < numDTypes; d++ {
		out = append(out, d)
	}
	return out
}

// Parse returns the DType spelled s (as in a safetensors header, case-insensitive).
func Parse(s string) (DType, error) {
	u := strings.ToUpper(s)
	for d := BOOL; d < numDTypes; d++ {
		if names[d] == u {
			return d, nil
		}
	}
	return Invalid, fmt.Errorf("dtype: unknown dtype %q (known: %s)", s, strings.Join(names[1:], ", "))
}

// String returns the safetensors spelling of d.
func (d DType) String() string {
	if d < numDTypes {
		return names[d]
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Size returns the width of one element in bytes, or 0 for an invalid DType.
func (d DType) Size() int {
	if d < numDTypes {
		return sizes[d]
	}
	return 0
}

// Valid reports whether d is one of the defined element types.
func (d DType) Valid() bool { return d > Invalid && d < numDTypes }

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	switch d {
	case F8E4M3, F8E5M2, F16, BF16, F32, F64:
		return true
	}
	return false
}

// MarshalText encodes d as its safetensors name.
func (d DType) MarshalText() ([]byte, error) {
	if !d.Valid() {
		return nil, fmt.Errorf("dtype: cannot encode invalid dtype %d", uint8(d))
	}
	return []byte(names[d]), nil
}

// UnmarshalText decodes a safetensors dtype name.
func (d *DType) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// Bytes returns the byte length of a tensor of this dtype and shape, and
// an error if a dimension is negative or the size overflows int64.
func (d DType) Bytes(shape []int64) (int64, error) {
	if !d.Valid() {
		return 0, fmt.Errorf("dtype: invalid dtype %d", uint8(d))
	}
	n := int64(d.Size())
	for _, dim := range shape {
		if dim < 0 {
			return 0, fmt.Errorf("dtype: negative dimension %d in shape %v", dim, shape)
		}
		if dim != 0 && n > (1<<62)/dim {
			return 0, fmt.Errorf("dtype: shape %v of %s overflows int64 bytes", shape, d)
		}
		n *= dim
	}
	return n, nil
}
