package safetensors

// The header's writer: the JSON the reference implementation writes, byte
// for byte, and its order of tensors (SortLikeReference).

import (
	"encoding/binary"
	"math"
	"sort"
	"strconv"

	"github.com/weightcast/weightcast/dtype"
)

// appendMetadata appends the "__metadata__" object of meta, keys in the
// order given, as the reference implementation writes it.
func appendMetadata(b []byte, meta map[string]string, keys []string) []byte {
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendSerdeString(b, k)
		b = append(b, ':')
		b = appendSerdeString(b, meta[k])
	}
	return append(b, '}')
}

// encodeHeader serializes a header the way the reference implementation
// does (see doc.go) and returns the 8-byte length, the padded JSON, and the
// data-region-relative begin offset of each tensor.
func encodeHeader(tensors []TensorInfo, meta map[string]string, keys []string) ([]byte, []int64, int64, error) {
	var b []byte
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0, '{')
	first := true
	if meta != nil {
		b = append(b, '"')
		b = append(b, MetadataKey...)
		b = append(b, `":`...)
		b = appendMetadata(b, meta, keys)
		first = false
	}
	begins := make([]int64, len(tensors))
	var off int64
	for i, t := range tensors {
		n, err := t.DType.Bytes(t.Shape)
		if err != nil {
			return nil, nil, 0, errorf("", t.Name, ErrShape, "%v", err)
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendSerdeString(b, t.Name)
		b = append(b, `:{"dtype":"`...)
		b = append(b, t.DType.String()...)
		b = append(b, `","shape":[`...)
		for j, d := range t.Shape {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, d, 10)
		}
		b = append(b, `],"data_offsets":[`...)
		b = strconv.AppendInt(b, off, 10)
		b = append(b, ',')
		if n > math.MaxInt64-off {
			return nil, nil, 0, errorf("", t.Name, ErrShape, "total data size overflows int64")
		}
		begins[i] = off
		off += n
		b = strconv.AppendInt(b, off, 10)
		b = append(b, "]}"...)
	}
	b = append(b, '}')
	for (len(b)-8)%8 != 0 {
		b = append(b, ' ')
	}
	binary.LittleEndian.PutUint64(b[:8], uint64(len(b)-8))
	return b, begins, off, nil
}

// appendSerdeString appends s as a JSON string escaped exactly as
// serde_json does: '"' and '\\' escaped, the control characters below 0x20
// as \b \t \n \f \r or \u00xx with lower-case hex, everything else (DEL,
// non-ASCII, '<', '&', U+2028) written raw.
func appendSerdeString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"':
			b = append(b, '\\', '"')
		case '\\':
			b = append(b, '\\', '\\')
		case '\b':
			b = append(b, '\\', 'b')
		case '\t':
			b = append(b, '\\', 't')
		case '\n':
			b = append(b, '\\', 'n')
		case '\f':
			b = append(b, '\\', 'f')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// referenceRank is the position of each dtype in the reference
// implementation's Dtype enum (safetensors/src/tensor.rs), which is ordered
// by alignment: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3,
// F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64. Only the
// relative order of the dtypes this package knows matters.
var referenceRank = map[dtype.DType]int{
	dtype.BOOL: 0, dtype.U8: 4, dtype.I8: 5, dtype.F8E5M2: 6, dtype.F8E4M3: 7,
	dtype.I16: 9, dtype.U16: 10, dtype.F16: 11, dtype.BF16: 12, dtype.I32: 13,
	dtype.U32: 14, dtype.F32: 15, dtype.F64: 17, dtype.I64: 18, dtype.U64: 19,
}

// SortLikeReference sorts tensors in the order the reference writer
// (Python/Rust safetensors save_file) lays them out: by dtype, widest
// alignment first in the reference's enum order, then by name (byte order).
// Create with the sorted list writes what the reference would write.
func SortLikeReference(tensors []TensorInfo) {
	sort.SliceStable(tensors, func(i, j int) bool {
		a, b := referenceRank[tensors[i].DType], referenceRank[tensors[j].DType]
		if a != b {
			return a > b
		}
		return tensors[i].Name < tensors[j].Name
	})
}
