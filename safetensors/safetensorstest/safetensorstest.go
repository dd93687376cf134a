// Package safetensorstest writes the safetensors checkpoints that tests
// sync and compares the directories receivers write them back into: the
// fixtures of the tests of package source (Checkpoint), package sink
// (WriteSafetensors) and package stages (Cast, Quantize, pack's staging of
// files), shared here because those packages cannot import each other's
// tests.
//
// It imports package safetensors only, so that the tests of every package
// above it can use it.
package safetensorstest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/safetensors"
)

// Spec is one tensor of a test checkpoint.
type Spec struct {
	Name  string
	DType dtype.DType
	Shape []int64
}

// Meta is the __metadata__ of every file Write writes: several keys,
// deliberately not sorted (MetaKeys is their order in the files).
var (
	Meta     = map[string]string{"format": "pt", "step": "1200", "author": "weightcast \"tests\" <é>\n"}
	MetaKeys = []string{"step", "format", "author"}
)

// IndexNote is the "note" of the index metadata Write writes.
const IndexNote = "sharded for tests"

// Write writes a checkpoint of the given shards into dir with
// deterministic random bytes (from seed) and returns the bytes of every
// tensor. With index it writes the files model-0000i-of-0000n.safetensors
// and an index whose metadata holds total_size and IndexNote; with one
// shard and no index, a single file called model.safetensors.
func Write(tb testing.TB, dir string, seed uint64, shards [][]Spec, index bool) map[string][]byte {
	tb.Helper()
	data := map[string][]byte{}
	rng := rand.New(rand.NewPCG(seed, 7))
	var layout safetensors.ModelLayout
	var total int64
	for i, sh := range shards {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		if !index {
			name = "model.safetensors"
		}
		sl := safetensors.ShardLayout{Name: name, Metadata: Meta, MetadataKeys: MetaKeys}
		for _, s := range sh {
			sl.Tensors = append(sl.Tensors, safetensors.TensorInfo{Name: s.Name, DType: s.DType, Shape: s.Shape})
			n, err := s.DType.Bytes(s.Shape)
			if err != nil {
				tb.Fatal(err)
			}
			b := make([]byte, n)
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			data[s.Name] = b
			total += n
		}
		layout.Shards = append(layout.Shards, sl)
	}
	if index {
		layout.IndexName = safetensors.IndexFileName
		layout.IndexMetadata = map[string]any{"total_size": json.Number(fmt.Sprint(total)), "note": IndexNote}
	}
	w, err := safetensors.CreateModel(dir, layout, safetensors.WithoutSync())
	if err != nil {
		tb.Fatal(err)
	}
	for name, b := range data {
		if err := w.WriteTensorAt(name, b, 0); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	return data
}

// Shards is a small checkpoint of several dtypes in three files: a tensor
// larger than 1 MiB (the largest test bucket), a zero-element tensor, odd
// sizes.
func Shards() [][]Spec {
	return [][]Spec{
		{
			{"model.embed_tokens.weight", dtype.BF16, []int64{640, 1024}}, // 1.25 MiB
			{"model.layers.0.input_layernorm.weight", dtype.F32, []int64{1024}},
			{"model.rotary_emb.unused", dtype.F32, []int64{0, 8}},
		},
		{
			{"model.layers.0.self_attn.q_proj.weight", dtype.BF16, []int64{96, 1000}},
			{"model.layers.0.self_attn.k_proj.bias", dtype.F16, []int64{77}},
			{"model.layers.0.mlp.gate.weight", dtype.F32, []int64{33, 129}},
			{"model.position_ids", dtype.I64, []int64{1, 513}},
			{"model.mask", dtype.BOOL, []int64{31}},
		},
		{
			{"model.norm.weight", dtype.F64, []int64{5}},
			{"model.quant.scale", dtype.U8, []int64{1000}},
			{"lm_head.weight", dtype.F32, []int64{128, 700}},
		},
	}
}

// CastShards is a checkpoint of mostly F32 in two files, with every other
// kind of tensor; lm_head is larger than Cast's scratch buffer (256 KiB).
func CastShards() [][]Spec {
	return [][]Spec{
		{
			{"embed.weight", dtype.F32, []int64{300, 40}},
			{"norm.weight", dtype.F32, []int64{40}},
			{"empty", dtype.F32, []int64{0}},
			{"bf16.weight", dtype.BF16, []int64{33, 3}},
		},
		{
			{"f16.weight", dtype.F16, []int64{7, 9}},
			{"ids", dtype.I32, []int64{100}},
			{"flags", dtype.U8, []int64{13}},
			{"f64.weight", dtype.F64, []int64{9}},
			{"fp8.weight", dtype.F8E4M3, []int64{10}},
			{"lm_head.weight", dtype.F32, []int64{200, 400}}, // 312.5 KiB
		},
	}
}

// DirFiles returns the names of the regular files in dir, sorted, and
// fails on anything else (a leftover staging directory).
func DirFiles(tb testing.TB, dir string) []string {
	tb.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if !e.Type().IsRegular() {
			tb.Fatalf("%s holds %s, which is not a regular file (a leftover round?)", dir, e.Name())
		}
		out = append(out, e.Name())
	}
	return out
}

// SameFiles fails unless directory got holds exactly the files of
// directory want, each byte for byte.
func SameFiles(tb testing.TB, want, got string) {
	tb.Helper()
	wn, gn := DirFiles(tb, want), DirFiles(tb, got)
	if !slices.Equal(wn, gn) {
		tb.Fatalf("%s has files %q, want %q", got, gn, wn)
	}
	for _, n := range wn {
		a, err := os.ReadFile(filepath.Join(want, n))
		if err != nil {
			tb.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(got, n))
		if err != nil {
			tb.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			i := 0
			for i < len(a) && i < len(b) && a[i] == b[i] {
				i++
			}
			tb.Fatalf("%s differs from the source %s (%d vs %d bytes) from byte %d:\n got  %.120q\n want %.120q",
				filepath.Join(got, n), filepath.Join(want, n), len(b), len(a), i, b[max(0, i-40):], a[max(0, i-40):])
		}
	}
}

// OutDirs returns n directory paths, not yet created, under a temporary
// directory of tb: where n receivers write their rounds.
func OutDirs(tb testing.TB, n int) []string {
	base := tb.TempDir()
	out := make([]string, n)
	for i := range out {
		out[i] = filepath.Join(base, fmt.Sprintf("rank%d", i+1))
	}
	return out
}

// RawTensor is a tensor as ReadRaw finds it.
type RawTensor struct {
	DType   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Offsets []int64 `json:"data_offsets"`
	// Data is the tensor's bytes.
	Data []byte `json:"-"`
}

// ReadRaw parses the safetensors file at path with encoding/json alone, as
// an independent check of what package safetensors writes, and returns its
// __metadata__ and its tensors by name. It fails unless the tensors cover
// the data region.
func ReadRaw(tb testing.TB, path string) (map[string]string, map[string]*RawTensor) {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b)
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &top); err != nil {
		tb.Fatalf("%s: header: %v", path, err)
	}
	var meta map[string]string
	tensors := map[string]*RawTensor{}
	var covered int64
	for k, v := range top {
		if k == "__metadata__" {
			if err := json.Unmarshal(v, &meta); err != nil {
				tb.Fatal(err)
			}
			continue
		}
		var rt RawTensor
		if err := json.Unmarshal(v, &rt); err != nil {
			tb.Fatal(err)
		}
		rt.Data = b[8+int64(n)+rt.Offsets[0] : 8+int64(n)+rt.Offsets[1]]
		covered += rt.Offsets[1] - rt.Offsets[0]
		tensors[k] = &rt
	}
	if covered != int64(len(b))-8-int64(n) {
		tb.Fatalf("%s: tensors cover %d of %d data bytes", path, covered, int64(len(b))-8-int64(n))
	}
	return meta, tensors
}

// Bench returns a sharded checkpoint of about total bytes in shards files,
// made once in a fixed directory under os.TempDir() and reused by later
// runs (and by other packages' benchmarks). Its tensors are BF16, of
// 32 MiB, 8 MiB and 16 KiB in turn, like the projections and norms of a
// transformer.
func Bench(b *testing.B, total int64, shards int) string {
	b.Helper()
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("weightcast-bench-checkpoint-%dMiB-%d", total>>20, shards))
	if m, err := safetensors.OpenModel(dir); err == nil {
		var size int64
		for _, t := range m.Tensors() {
			size += t.Size
		}
		m.Close()
		if size == total {
			return dir
		}
	}
	os.RemoveAll(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	sizes := []int64{32 << 20, 8 << 20, 16 << 10}
	per := total / int64(shards)
	var layout safetensors.ModelLayout
	k := 0
	for s := range shards {
		sl := safetensors.ShardLayout{Name: fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, shards), Metadata: map[string]string{"format": "pt"}}
		for have := int64(0); have < per; k++ {
			n := min(sizes[k%len(sizes)], per-have)
			sl.Tensors = append(sl.Tensors, safetensors.TensorInfo{Name: fmt.Sprintf("model.layers.%d.weight", k), DType: dtype.BF16, Shape: []int64{n / 2}})
			have += n
		}
		layout.Shards = append(layout.Shards, sl)
	}
	layout.IndexName = safetensors.IndexFileName
	w, err := safetensors.CreateModel(dir, layout, safetensors.WithoutSync())
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + i>>9)
	}
	for _, sh := range w.Shards() {
		for left := sh.Size() - sh.DataOffset(); left > 0; left -= int64(len(chunk)) {
			if _, err := sh.Write(chunk[:min(int64(len(chunk)), left)]); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	return dir
}

// BenchFiles lists the shard files of the checkpoint in dir and their
// total size.
func BenchFiles(b *testing.B, dir string) ([]string, int64) {
	b.Helper()
	m, err := safetensors.OpenModel(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	var paths []string
	var total int64
	for _, f := range m.Shards() {
		paths = append(paths, f.Path())
		total += f.Size()
	}
	return paths, total
}
