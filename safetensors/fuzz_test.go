package safetensors

import (
	"bytes"
	"errors"
	"maps"
	"slices"
	"testing"
)

// FuzzParseHeader checks that ParseHeader never panics, that every error is
// an *Error, and that an accepted header, written again by the writer's
// encoder, parses to the same tensors and metadata and encodes to the same
// bytes. Seeds are in testdata/fuzz/FuzzParseHeader.
func FuzzParseHeader(f *testing.F) {
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b, WithLimits(Limits{MaxTensors: 4096, MaxHeaderBytes: 1 << 20}))
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %T is not *Error: %v", err, err)
			}
			return
		}
		var pos int64
		for _, tn := range h.Tensors {
			if tn.Offset-h.DataOffset() != pos {
				t.Fatalf("%q at %d, want %d", tn.Name, tn.Offset-h.DataOffset(), pos)
			}
			pos += tn.Size
		}
		if pos != h.DataSize {
			t.Fatalf("tensors cover %d bytes, DataSize %d", pos, h.DataSize)
		}
		infos := make([]TensorInfo, len(h.Tensors))
		for i, tn := range h.Tensors {
			infos[i] = tn.Info()
		}
		enc, _, size, err := encodeHeader(infos, h.Metadata, h.MetadataKeys)
		if err != nil {
			t.Fatalf("encoding an accepted header: %v", err)
		}
		if size != h.DataSize || len(enc)%8 != 0 {
			t.Fatalf("encoded data size %d (header %d bytes), want %d", size, len(enc), h.DataSize)
		}
		h2, err := ParseHeader(enc[8:], WithLimits(Limits{MaxTensors: 4096, MaxHeaderBytes: 1 << 21}))
		if err != nil {
			t.Fatalf("re-encoded header does not parse: %v\n%q", err, enc)
		}
		if len(h2.Tensors) != len(h.Tensors) {
			t.Fatalf("%d tensors after re-encoding, want %d", len(h2.Tensors), len(h.Tensors))
		}
		for i := range h.Tensors {
			a, c := h.Tensors[i], h2.Tensors[i]
			if a.Name != c.Name || a.DType != c.DType || !slices.Equal(a.Shape, c.Shape) || a.Size != c.Size ||
				a.Offset-h.DataOffset() != c.Offset-h2.DataOffset() {
				t.Fatalf("tensor %d: %+v became %+v", i, a, c)
			}
		}
		if (h.Metadata == nil) != (h2.Metadata == nil) || !maps.Equal(h.Metadata, h2.Metadata) || !slices.Equal(h.MetadataKeys, h2.MetadataKeys) {
			t.Fatalf("metadata %q became %q", h.Metadata, h2.Metadata)
		}
		enc2, _, _, err := encodeHeader(infos, h2.Metadata, h2.MetadataKeys)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable: %v\n%q\n%q", err, enc, enc2)
		}
	})
}
