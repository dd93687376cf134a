package wire

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

// TestSourceInfoDTypesWire checks that a shard's dtypes and shapes survive
// the wire, and are left out (so older peers decode the metadata) when
// unknown.
func TestSourceInfoDTypesWire(t *testing.T) {
	m := &BucketMeta{Source: &SourceInfo{Format: "synthetic", Shards: []ShardInfo{{File: "a.safetensors", Tensors: []string{"x"}}}}}
	b, err := EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("dtypes")) || bytes.Contains(b, []byte("shapes")) {
		t.Fatalf("a shard without dtypes encodes them: %s", b)
	}
	m.Source.Shards[0].DTypes, m.Source.Shards[0].Shapes = []dtype.DType{dtype.BF16}, [][]int64{{2, 3}}
	if b, err = EncodeMeta(m); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"dtypes":["BF16"],"shapes":[[2,3]]`)) {
		t.Fatalf("encoded %s", b)
	}
	got, err := DecodeMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	if sh := got.Source.Shards[0]; !slices.Equal(sh.DTypes, []dtype.DType{dtype.BF16}) || len(sh.Shapes) != 1 || !slices.Equal(sh.Shapes[0], []int64{2, 3}) {
		t.Fatalf("decoded %+v", sh)
	}
}

// TestEncodeMetaIsMarshal: EncodeMeta, which skips the pass in which
// json.Marshal checks and compacts what MarshalJSON returns, writes the
// very bytes json.Marshal does.
func TestEncodeMetaIsMarshal(t *testing.T) {
	for _, m := range []*BucketMeta{directMeta(), {Seq: 3, Entries: []Entry{{Name: "a<b>&c", DType: dtype.F32, Shape: []int64{2}, Size: 8, Total: 8}}, Length: 8, IsLast: true, HasMAC: true}} {
		got, err := EncodeMeta(m)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("EncodeMeta:\n%s\njson.Marshal:\n%s", got, want)
		}
	}
}
