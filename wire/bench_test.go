package wire

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

// directMeta is the metadata of a direct 1 GiB bucket of a colocated
// round: 37 whole tensors of a 300-tensor bf16 model in one allocation of the
// sender, as the demo's 8 GiB model lays them out.
func directMeta() *BucketMeta {
	const each = 28632576 // (8 GiB / 300) rounded down to 512
	m := &BucketMeta{Seq: 41, Index: 1, Version: 5, Checksum: 0x1234, HasChecksum: true,
		Direct: &DirectInfo{PID: 4242, Allocs: []DirectAlloc{{Handle: strings.Repeat("ab", 64), Size: 300 * each, Addr: "7f0000000000"}}}}
	for k := 37; m.Length+each <= 1<<30; k++ {
		m.Entries = append(m.Entries, Entry{Name: fmt.Sprintf("model.layers.%d.mlp.up_proj.weight", k), DType: dtype.BF16,
			Shape: []int64{each / 2}, Offset: m.Length, Size: each, Total: each, Src: &EntrySource{Offset: int64(k) * each}})
		m.Length += each
	}
	return m
}

// BenchmarkMetaDirect times encoding and decoding the metadata of a
// direct 1 GiB bucket, what the sender's publish stage and each
// receiver's subscribe stage do once per bucket before its copies can
// start; json.Marshal of it, which checks and compacts again what
// MarshalJSON returns; and its decoding by encoding/json alone, without
// the canonical decoder (docs/benchmarks.md, "Bucket metadata: encoding and
// decoding").
func BenchmarkMetaDirect(b *testing.B) {
	m := directMeta()
	enc, err := EncodeMeta(m)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"encode", func() error { _, err := EncodeMeta(m); return err }},
		{"json.Marshal", func() error { _, err := json.Marshal(m); return err }}, // what EncodeMeta called until 2026-12-03
		{"decode", func() error { _, err := DecodeMeta(enc); return err }},
		{"json.Unmarshal", func() error { _, err := decodeJSON(enc); return err }}, // what DecodeMeta did until 2026-12-03
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(enc)))
			for range b.N {
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
