package safetensors

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// rawFile writes an 8-byte length, header (as is) and data to a new file.
func rawFile(t *testing.T, header string, data []byte) string {
	t.Helper()
	return rawFileN(t, uint64(len(header)), header, data)
}

func rawFileN(t *testing.T, n uint64, header string, data []byte) string {
	t.Helper()
	b := binary.LittleEndian.AppendUint64(nil, n)
	b = append(b, header...)
	b = append(b, data...)
	p := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOpenRejectsMalformed(t *testing.T) {
	f32 := func(name string, shape string, b, e int) string {
		return `"` + name + `":{"dtype":"F32","shape":` + shape + `,"data_offsets":[` + strconv.Itoa(b) + `,` + strconv.Itoa(e) + `]}`
	}
	zeros := func(n int) []byte { return make([]byte, n) }
	cases := []struct {
		name   string
		header string
		n      uint64 // header length to claim; 0 means len(header)
		data   []byte
		want   error
		tensor string // tensor the error must name
		limits Limits
	}{
		{name: "not json", header: `hello`, want: ErrHeaderJSON},
		{name: "cut json", header: `{"a":{"dtype":"F32"`, want: ErrHeaderJSON, tensor: "a"},
		{name: "empty header", header: ``, want: ErrHeaderJSON},
		{name: "array", header: `[]`, want: ErrHeaderJSON},
		{name: "invalid utf8", header: "{\"a\xff\":{}}", want: ErrHeaderJSON},
		{name: "trailing garbage", header: `{}x`, want: ErrHeaderJSON},
		{name: "nul padding", header: "{}\x00\x00", want: ErrHeaderJSON},
		{name: "reference empty-metadata quirk", header: `{},"__metadata__":{}}   `, want: ErrHeaderJSON},
		{name: "metadata not strings", header: `{"__metadata__":{"a":1}}`, want: ErrHeaderJSON},
		{name: "metadata twice", header: `{"__metadata__":{},"__metadata__":{}}`, want: ErrHeaderJSON},
		{name: "metadata key twice", header: `{"__metadata__":{"a":"1","a":"2"}}`, want: ErrHeaderJSON},
		{name: "missing dtype", header: `{"a":{"shape":[1],"data_offsets":[0,4]}}`, data: zeros(4), want: ErrHeaderJSON, tensor: "a"},
		{name: "missing offsets", header: `{"a":{"dtype":"F32","shape":[1]}}`, data: zeros(4), want: ErrHeaderJSON, tensor: "a"},
		{name: "field twice", header: `{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, data: zeros(4), want: ErrHeaderJSON, tensor: "a"},
		{name: "float dim", header: `{` + f32("a", "[1.0]", 0, 4) + `}`, data: zeros(4), want: ErrHeaderJSON, tensor: "a"},
		{name: "three offsets", header: `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}`, data: zeros(4), want: ErrHeaderJSON, tensor: "a"},
		{name: "header too large", header: `{}`, n: 200_000_000, want: ErrHeaderSize},
		{name: "header past file", header: `{}      `, n: 64, want: ErrHeaderSize},
		{name: "header over custom limit", header: `{}      `, want: ErrHeaderSize, limits: Limits{MaxHeaderBytes: 4}},
		{name: "reversed offsets", header: `{` + f32("a", "[1]", 8, 4) + `}`, data: zeros(8), want: ErrOffsets, tensor: "a"},
		{name: "negative offset", header: `{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, data: zeros(4), want: ErrOffsets, tensor: "a"},
		{name: "huge offset", header: `{"a":{"dtype":"U8","shape":[0],"data_offsets":[99999999999999999999,99999999999999999999]}}`, want: ErrOffsets, tensor: "a"},
		{name: "overlap", header: `{` + f32("a", "[2]", 0, 8) + `,` + f32("b", "[2]", 4, 12) + `}`, data: zeros(12), want: ErrOverlap, tensor: "b"},
		{name: "same range", header: `{` + f32("a", "[1]", 0, 4) + `,` + f32("b", "[1]", 0, 4) + `}`, data: zeros(4), want: ErrOverlap, tensor: "b"},
		{name: "empty tensor inside another", header: `{` + f32("a", "[2]", 0, 8) + `,` + f32("z", "[0]", 4, 4) + `}`, data: zeros(8), want: ErrOverlap, tensor: "z"},
		{name: "gap between", header: `{` + f32("a", "[1]", 0, 4) + `,` + f32("b", "[1]", 8, 12) + `}`, data: zeros(12), want: ErrGap, tensor: "b"},
		{name: "gap at start", header: `{` + f32("a", "[1]", 4, 8) + `}`, data: zeros(8), want: ErrGap, tensor: "a"},
		{name: "trailing bytes", header: `{` + f32("a", "[1]", 0, 4) + `}`, data: zeros(6), want: ErrGap},
		{name: "data but no tensors", header: `{}`, data: zeros(1), want: ErrGap},
		{name: "unknown dtype", header: `{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}`, data: zeros(1), want: ErrDType, tensor: "a"},
		{name: "reference-only dtype", header: `{"a":{"dtype":"F8_E8M0","shape":[1],"data_offsets":[0,1]}}`, data: zeros(1), want: ErrDType, tensor: "a"},
		{name: "lower-case dtype", header: `{"a":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}}`, data: zeros(4), want: ErrDType, tensor: "a"},
		{name: "shape too small", header: `{` + f32("a", "[3]", 0, 8) + `}`, data: zeros(8), want: ErrShape, tensor: "a"},
		{name: "shape too large", header: `{` + f32("a", "[2,2]", 0, 8) + `}`, data: zeros(8), want: ErrShape, tensor: "a"},
		{name: "shape overflows", header: `{` + f32("a", "[4611686018427387904,4]", 0, 8) + `}`, data: zeros(8), want: ErrShape, tensor: "a"},
		{name: "negative dim", header: `{` + f32("a", "[-1]", 0, 4) + `}`, data: zeros(4), want: ErrNegativeDim, tensor: "a"},
		{name: "truncated data", header: `{` + f32("a", "[2]", 0, 8) + `,` + f32("b", "[2]", 8, 16) + `}`, data: zeros(12), want: ErrTruncated, tensor: "b"},
		{name: "empty name", header: `{` + f32("", "[1]", 0, 4) + `}`, data: zeros(4), want: ErrName},
		{name: "duplicate name", header: `{` + f32("a", "[1]", 0, 4) + `,` + f32("a", "[1]", 4, 8) + `}`, data: zeros(8), want: ErrDuplicate, tensor: "a"},
		{name: "too many tensors", header: `{` + f32("a", "[1]", 0, 4) + `,` + f32("b", "[1]", 4, 8) + `}`, data: zeros(8), want: ErrLimit, tensor: "b", limits: Limits{MaxTensors: 1}},
		{name: "name too long", header: `{` + f32("abcdef", "[1]", 0, 4) + `}`, data: zeros(4), want: ErrLimit, tensor: "abcdef", limits: Limits{MaxNameBytes: 5}},
		{name: "rank too high", header: `{` + f32("a", "[1,1,1]", 0, 4) + `}`, data: zeros(4), want: ErrLimit, tensor: "a", limits: Limits{MaxRank: 2}},
		{name: "nesting too deep", header: `{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}}`, want: ErrHeaderJSON, tensor: "a"},
		{name: "lone surrogate", header: `{"a\ud800":{}}`, want: ErrHeaderJSON},
		{name: "raw control char", header: "{\"a\x01\":{}}", want: ErrHeaderJSON},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := c.n
			if n == 0 {
				n = uint64(len(c.header))
			}
			p := rawFileN(t, n, c.header, c.data)
			f, err := Open(p, WithLimits(c.limits))
			if err == nil {
				f.Close()
				t.Fatalf("Open succeeded, want %v", c.want)
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("error %q is not %v", err, c.want)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not *Error", err)
			}
			if e.File != p || !strings.Contains(err.Error(), p) {
				t.Errorf("error %q does not name the file %s", err, p)
			}
			if e.Tensor != c.tensor {
				t.Errorf("error names tensor %q, want %q (%v)", e.Tensor, c.tensor, err)
			}
			if c.tensor != "" && !strings.Contains(err.Error(), `"`+c.tensor+`"`) {
				t.Errorf("error %q does not name tensor %q", err, c.tensor)
			}
		})
	}
}

func TestOpenAcceptsLenientInput(t *testing.T) {
	// What the reference reader accepts, this one accepts too.
	cases := []struct{ name, header string }{
		{"leading and trailing whitespace", " \n{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}\t\r\n "},
		{"unknown field", `{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"extra":{"x":[1,2.5e3,true,null,"s"]}}}`},
		{"null metadata", `{"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`},
		{"fields reordered", `{"a":{"data_offsets":[0,2],"shape":[2],"dtype":"U8"}}`},
		{"escaped name", `{"\u0061":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := Open(rawFile(t, c.header, []byte{1, 2}))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Len() != 1 {
				t.Fatalf("%d tensors, want 1", f.Len())
			}
			tn := f.Tensors()[0]
			if tn.Name != "a" || tn.Size != 2 || tn.Offset != f.DataOffset() {
				t.Fatalf("tensor %+v", tn)
			}
			if f.Metadata() != nil {
				t.Fatalf("metadata %v, want nil", f.Metadata())
			}
		})
	}
}

func TestTruncatedFile(t *testing.T) {
	full := writeSample(t, t.TempDir())
	b, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	for cut := 0; cut < len(b); cut++ {
		p := filepath.Join(t.TempDir(), "cut.safetensors")
		if err := os.WriteFile(p, b[:cut], 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := Open(p)
		if err == nil {
			f.Close()
			t.Fatalf("a file cut to %d of %d bytes opened", cut, len(b))
		}
		hdrEnd := 8 + int(binary.LittleEndian.Uint64(b))
		var want error
		switch {
		case cut < 8:
			want = ErrTruncated
		case cut < hdrEnd:
			want = ErrHeaderSize
		default:
			want = ErrTruncated
		}
		if !errors.Is(err, want) {
			t.Fatalf("cut to %d: %v, want %v", cut, err, want)
		}
	}
}
