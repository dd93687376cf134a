package wire

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
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

// TestDirectTurns: a direct bucket's turns travel intact (through the
// canonical decoder), and turns that place their words outside the
// bucket's allocations, or count nothing, are refused with what is wrong.
func TestDirectTurns(t *testing.T) {
	turned := func(f func(*DirectTurns)) *BucketMeta {
		m := directMeta()
		m.Direct.Allocs = append(m.Direct.Allocs, DirectAlloc{Handle: strings.Repeat("cd", 64), Size: 64, Addr: "7f1000000000"})
		m.Direct.Turns = &DirectTurns{Alloc: 1, Receivers: 3, Round: MaxTurnsRound, Every: 4}
		f(m.Direct.Turns)
		return m
	}
	m := turned(func(*DirectTurns) {})
	enc, err := EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(enc), `"turns":{"alloc":1,"receivers":3,"round":2147483647,"every":4}`) {
		t.Fatalf("turns encoded as %s", enc)
	}
	if got, ok := decodeCanonical(enc); !ok || !reflect.DeepEqual(got.Direct.Turns, m.Direct.Turns) {
		t.Fatalf("the canonical decoder read turns %+v (ok %v)", got, ok)
	}
	if got, err := DecodeMeta(enc); err != nil || !reflect.DeepEqual(got.Direct.Turns, m.Direct.Turns) {
		t.Fatalf("DecodeMeta: %+v, %v", got, err)
	}
	for _, c := range []struct {
		name string
		f    func(*DirectTurns)
		want string
	}{
		{"words in no allocation", func(d *DirectTurns) { d.Alloc = 2 }, "allocation 2 of 2"},
		{"negative allocation", func(d *DirectTurns) { d.Alloc = -1 }, "allocation -1 of 2"},
		{"no receivers", func(d *DirectTurns) { d.Receivers = 0 }, "turns of 0 receivers"},
		{"words past the allocation", func(d *DirectTurns) { d.Receivers = 9 }, "do not fit their 64-byte allocation"},
		{"round 0", func(d *DirectTurns) { d.Round = 0 }, "turns of round 0"},
		{"a round past 2^31-1", func(d *DirectTurns) { d.Round = MaxTurnsRound + 1 }, "turns of round 2147483648"},
		{"groups of no bucket", func(d *DirectTurns) { d.Every = 0 }, "turns of 0 buckets"},
	} {
		enc, err := EncodeMeta(turned(c.f))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeMeta(enc); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: DecodeMeta said %v, want %q", c.name, err, c.want)
		}
	}
	// A round past 32 bits is refused by both decoders.
	bad := strings.Replace(string(enc), `"round":2147483647`, `"round":4294967296`, 1)
	if _, err := DecodeMeta([]byte(bad)); err == nil {
		t.Error("a round of 2^32 was taken")
	}
}
