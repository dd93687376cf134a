package wire

import (
	"testing"
)

// FuzzDecodeMeta feeds arbitrary bytes to the metadata decoder: it must
// never panic, and whatever it accepts must pass Check and survive a round
// trip through EncodeMeta unchanged.
func FuzzDecodeMeta(f *testing.F) {
	f.Add([]byte(`{"seq":0,"index":0,"version":1,"length":64,"is_last":true,"checksum":"ff","entries":[{"name":"w","dtype":"F32","shape":[4,4],"offset":0,"size":64,"chunk":0,"total":64}]}`))
	f.Add([]byte(`{"seq":3,"length":0,"entries":[]}`))
	f.Add([]byte(`{"seq":1,"length":10,"entries":[{"name":"a","dtype":"U8","shape":[20],"offset":0,"size":10,"chunk":10,"total":20}]}`))
	f.Add([]byte(`{"seq":0,"length":4,"entries":[{"name":"a","dtype":"F128","shape":[1],"offset":0,"size":4,"total":4}]}`))
	f.Add([]byte(`{"seq":0,"length":-1}`))
	f.Add([]byte(`{"source":{"format":"safetensors","metadata":{"format":"pt"},"shards":[{"file":"a","tensors":["x"]}]},"length":0}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeMeta(b)
		if err != nil {
			return
		}
		if err := m.Check(); err != nil {
			t.Fatalf("DecodeMeta accepted metadata that fails Check: %v", err)
		}
		enc, err := EncodeMeta(m)
		if err != nil {
			t.Fatalf("accepted metadata does not encode: %v", err)
		}
		back, err := DecodeMeta(enc)
		if err != nil {
			t.Fatalf("re-encoded metadata is rejected: %v", err)
		}
		if back.Seq != m.Seq || back.Length != m.Length || back.Checksum != m.Checksum || len(back.Entries) != len(m.Entries) {
			t.Fatalf("round trip changed the metadata: %+v -> %+v", m, back)
		}
	})
}
