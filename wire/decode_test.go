package wire

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mac"
)

// canonicalMetas are metadata of every shape senders write: a direct
// bucket, a round's first bucket with its model description, a signed
// bucket, a split tensor's chunk, no entries at all, names beyond ASCII.
func canonicalMetas() []*BucketMeta {
	first := &BucketMeta{Seq: 0, Version: 1, Length: 128, Checksum: 0xfedcba9876543210, HasChecksum: true,
		Entries: []Entry{
			{Name: "embed.weight", DType: dtype.BF16, Shape: []int64{8, 4}, Offset: 0, Size: 64, Total: 64},
			{Name: "lm_head.weight", DType: dtype.F32, Shape: []int64{16}, Offset: 64, Size: 64, Total: 64},
		},
		Source: &SourceInfo{Format: "safetensors", Metadata: map[string]string{"format": "pt", "note": `a "quoted" \ value`}, MetadataKeys: []string{"format", "note"},
			Shards:        []ShardInfo{{File: "model-00001.safetensors", Tensors: []string{"embed.weight"}, DTypes: []dtype.DType{dtype.BF16}, Shapes: [][]int64{{8, 4}}}},
			IndexMetadata: json.RawMessage(`{"total_size":128}`)}}
	signed := &BucketMeta{Seq: 7, Index: 2, Version: 3, Length: 4096, IsLast: true, HasMAC: true,
		Entries: []Entry{{Name: "w", DType: dtype.F8E4M3, Shape: []int64{64, 64}, Size: 4096, Total: 4096}}}
	for i := range signed.MAC {
		signed.MAC[i] = byte(i * 7)
	}
	nonce := mac.Nonce{0: 0xa5, 15: 0x5a}
	poly := &BucketMeta{Seq: 8, Index: 3, Version: 3, Length: 64, HasMAC: true, MACNonce: &nonce,
		MAC:     mac.PolyTag{0: 1, 7: 0x77, 15: 0xff}.AsTag(),
		Entries: []Entry{{Name: "b", DType: dtype.BF16, Shape: []int64{32}, Size: 64, Total: 64}}}
	chunk := &BucketMeta{Seq: 1 << 40, Index: 5, Version: 1<<64 - 1, Length: 1 << 20,
		Entries: []Entry{{Name: "model.layers.0.mlp.down_proj.weight", DType: dtype.I64, Shape: []int64{1 << 20}, Offset: 0, Size: 1 << 20, Chunk: 3 << 20, Total: 8 << 20}}}
	return []*BucketMeta{
		directMeta(), first, signed, poly, chunk,
		{Seq: 3, Entries: []Entry{}},
		{Seq: 4, Length: 8, Entries: []Entry{{Name: "héllo.wörld.权重", DType: dtype.U8, Shape: []int64{}, Size: 1, Total: 1}}},
	}
}

// TestDecodeCanonical: what EncodeMeta writes is read without
// encoding/json, into the very metadata encoding/json reads from it.
func TestDecodeCanonical(t *testing.T) {
	for i, m := range canonicalMetas() {
		enc, err := EncodeMeta(m)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := decodeCanonical(enc)
		if !ok {
			t.Fatalf("meta %d: the canonical decoder declined what EncodeMeta wrote: %s", i, enc)
		}
		want, err := decodeJSON(enc)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("meta %d: the canonical decoder read\n%+v\nencoding/json\n%+v", i, got, want)
		}
		if _, err := DecodeMeta(enc); err != nil {
			t.Fatalf("meta %d: %v", i, err)
		}
	}
}

// TestDecodeCanonicalDeclines: JSON outside the form senders write is
// left to encoding/json, which decides what it means (each of these is
// valid metadata) or what is wrong with it.
func TestDecodeCanonicalDeclines(t *testing.T) {
	const entry = `{"name":"w","dtype":"F32","shape":[2],"offset":0,"size":8,"chunk":0,"total":8}`
	valid := []string{
		`{"seq":1,"length":8,"entries":[{"name":"w\u0041","dtype":"F32","shape":[2],"offset":0,"size":8,"chunk":0,"total":8}]}`, // an escape
		`{"SEQ":1,"length":8,"entries":[` + entry + `]}`,                                                                        // another case
		`{"seq":1,"seq":2,"length":8,"entries":[` + entry + `]}`,                                                                // a key twice
		`{"seq":1,"length":8,"extra":{"a":[1,2]},"entries":[` + entry + `]}`,                                                    // a key it does not know
		`{"seq":1,"length":8,"source":null,"entries":[` + entry + `]}`,                                                          // a null
		`{"seq":1,"length":8,"entries":[` + entry + `],"direct":null}`,                                                          // another null
	}
	for _, s := range valid {
		if _, ok := decodeCanonical([]byte(s)); ok {
			t.Errorf("the canonical decoder took %s", s)
		}
		want, err := decodeJSON([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		got, err := DecodeMeta([]byte(s))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("DecodeMeta(%s) = %+v, %v; encoding/json reads %+v", s, got, err, want)
		}
	}
	invalid := map[string]string{
		`{"seq":-1,"entries":[]}`:                                              "cannot unmarshal number -1",
		`{"seq":01,"entries":[]}`:                                              "invalid character '1'",
		`{"seq":1,"entries":[]} x`:                                             "invalid character 'x'",
		`{"seq":1,"length":8.5,"entries":[]}`:                                  "cannot unmarshal number 8.5",
		`{"seq":1,"length":99999999999999999999,"entries":[]}`:                 "cannot unmarshal number 99999999999999999999",
		`{"seq":1,"checksum":"xyz","entries":[]}`:                              `malformed checksum "xyz"`,
		`{"seq":1,"bucket_mac":"00","entries":[]}`:                             "malformed bucket MAC",
		`{"seq":1,"mac_nonce":"` + strings.Repeat("0", 32) + `","entries":[]}`: "a mac_nonce without a bucket_mac",
		`{"seq":1,"bucket_mac":"` + strings.Repeat("0", 64) + `","mac_nonce":"` + strings.Repeat("0", 32) + `","entries":[]}`: "malformed Poly1305-AES bucket MAC (with a mac_nonce)",
		`{"seq":1,"bucket_mac":"` + strings.Repeat("0", 32) + `","entries":[]}`:                                               "want 64 hex digits",
		`{"seq":1,"bucket_mac":"` + strings.Repeat("0", 32) + `","mac_nonce":"00","entries":[]}`:                              "malformed mac_nonce",
		`{"seq":1,"length":8,"entries":[` + strings.Replace(entry, "F32", "F128", 1) + `]}`:                                   "F128",
		`{"seq":1,"entries":[],"source":{"format":1}}`:                                                                        "cannot unmarshal number",
		`{"seq":1,"entries":[{"name":"a` + "\x01" + `"}]}`:                                                                    "invalid character",
		`{"seq":1,"entries":[]`: "unexpected end of JSON input",
	}
	for s, want := range invalid {
		if _, ok := decodeCanonical([]byte(s)); ok {
			t.Errorf("the canonical decoder took %s", s)
		}
		if _, err := DecodeMeta([]byte(s)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeMeta(%s) = %v, want an error with %q", s, err, want)
		}
	}
}

// FuzzDecodeCanonical: wherever the canonical decoder takes a message,
// encoding/json takes it too and reads the same metadata.
func FuzzDecodeCanonical(f *testing.F) {
	small := directMeta()
	small.Entries, small.Length = small.Entries[:2], 2*small.Entries[0].Size
	// Seeds of a few hundred bytes: the fuzzer all but stops on one of
	// several kilobytes (a whole direct bucket's metadata), with
	// encoding/json alone too.
	for _, m := range append(canonicalMetas()[1:], small) {
		enc, err := EncodeMeta(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(enc)
	}
	f.Add([]byte(` { "seq" : 2 , "entries" : [ ] , "direct" : { "pid" : 1 , "allocs" : [ ] } } `))
	f.Add([]byte(`{"source":{"format":"x","metadata":{"}":"{"}},"seq":-0}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := decodeCanonical(b)
		if !ok {
			return
		}
		want, err := decodeJSON(b)
		if err != nil {
			t.Fatalf("the canonical decoder took what encoding/json rejects (%v): %q", err, b)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: the canonical decoder read\n%s\nencoding/json\n%s", b, fmt.Sprintf("%+v", got), fmt.Sprintf("%+v", want))
		}
	})
}

// TestCheckPolyMAC: a nonce needs a Poly1305-AES MAC beside it, whose last
// 16 bytes (of the Tag that holds it) are zero.
func TestCheckPolyMAC(t *testing.T) {
	nonce := mac.Nonce{1}
	for _, m := range []*BucketMeta{
		{Seq: 1, Entries: []Entry{}, MACNonce: &nonce},
		{Seq: 1, Entries: []Entry{}, MACNonce: &nonce, HasMAC: true, MAC: mac.Tag{31: 1}},
	} {
		if err := m.Check(); err == nil || !strings.Contains(err.Error(), "nonce without a Poly1305-AES MAC") {
			t.Errorf("%+v: %v", m, err)
		}
	}
	ok := &BucketMeta{Seq: 1, Entries: []Entry{}, MACNonce: &nonce, HasMAC: true, MAC: mac.PolyTag{15: 1}.AsTag()}
	if err := ok.Check(); err != nil {
		t.Error(err)
	}
	enc, err := EncodeMeta(ok)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"bucket_mac":"00000000000000000000000000000001","mac_nonce":"01000000000000000000000000000000"`; !strings.Contains(string(enc), want) {
		t.Errorf("%s lacks %s", enc, want)
	}
}
