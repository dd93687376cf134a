package safetensors

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

var nameParts = []string{
	"model", "layers", "0", "17", "weight", "bias", "q_proj", "é", "名前", "😀",
	`"`, `\`, "\t", "\n", "\x01", "\x7f", "<&>", "\u2028", "/", " ", ".",
}

// randomLayout returns tensors of random names, dtypes and shapes (some of
// zero size), their data, and metadata (nil, empty or random).
func randomLayout(rng *rand.Rand, n int) ([]TensorInfo, map[string][]byte, map[string]string) {
	all := dtype.All()
	infos := make([]TensorInfo, 0, n)
	data := map[string][]byte{}
	for len(infos) < n {
		var name strings.Builder
		for range 1 + rng.IntN(5) {
			name.WriteString(nameParts[rng.IntN(len(nameParts))])
		}
		if _, dup := data[name.String()]; dup || name.String() == MetadataKey {
			continue
		}
		d := all[rng.IntN(len(all))]
		shape := make([]int64, rng.IntN(4))
		for i := range shape {
			shape[i] = int64(rng.IntN(5))
			if rng.IntN(8) == 0 {
				shape[i] = 0
			}
		}
		size, _ := d.Bytes(shape)
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		infos = append(infos, TensorInfo{Name: name.String(), DType: d, Shape: shape})
		data[name.String()] = b
	}
	var meta map[string]string
	switch rng.IntN(3) {
	case 1:
		meta = map[string]string{}
	case 2:
		meta = map[string]string{}
		for range 1 + rng.IntN(4) {
			meta[nameParts[rng.IntN(len(nameParts))]+"k"] = nameParts[rng.IntN(len(nameParts))]
		}
	}
	return infos, data, meta
}

// writeAll creates path with infos and writes every tensor's data.
func writeAll(t testing.TB, path string, infos []TensorInfo, data map[string][]byte, meta map[string]string, opts ...Option) {
	t.Helper()
	w, err := Create(path, infos, meta, append([]Option{WithoutSync()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range infos {
		if _, err := w.CopyTensor(context.Background(), ti.Name, bytes.NewReader(data[ti.Name])); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeSample writes a small file of several dtypes into dir.
func writeSample(t testing.TB, dir string) string {
	infos, data, _ := randomLayout(rand.New(rand.NewPCG(1, 2)), 6)
	p := filepath.Join(dir, "sample.safetensors")
	writeAll(t, p, infos, data, map[string]string{"format": "pt"})
	return p
}

// rewrite writes src again to dst with its own order and metadata.
func rewrite(t testing.TB, src *File, dst string) {
	t.Helper()
	w, err := Create(dst, src.Infos(), src.Metadata(), WithMetadataOrder(src.MetadataKeys()), WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range src.Tensors() {
		sec, err := src.Section(tn.Name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.CopyTensor(context.Background(), tn.Name, sec); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func sameFile(t testing.TB, a, b string) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x, y) {
		n := min(len(x), len(y))
		i := 0
		for i < n && x[i] == y[i] {
			i++
		}
		t.Fatalf("%s and %s differ at byte %d (%d vs %d bytes)\n%q\n%q", a, b, i, len(x), len(y),
			x[max(0, i-40):min(len(x), i+40)], y[max(0, i-40):min(len(y), i+40)])
	}
}

// miniTensor is what miniRead finds for one tensor.
type miniTensor struct {
	DType string
	Shape []int64
	Data  []byte
}

// miniRead is an independent reader written from the format description
// alone: it shares no code with the package's parser.
func miniRead(path string) (map[string]miniTensor, map[string]string, bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, false, err
	}
	if len(b) < 8 {
		return nil, nil, false, fmt.Errorf("short file")
	}
	n := binary.LittleEndian.Uint64(b)
	if n%8 != 0 || uint64(len(b)-8) < n {
		return nil, nil, false, fmt.Errorf("header length %d not aligned or too long", n)
	}
	hdr := b[8 : 8+n]
	trimmed := bytes.TrimRight(hdr, " ")
	if len(hdr)-len(trimmed) >= 8 || !bytes.HasSuffix(trimmed, []byte("}")) {
		return nil, nil, false, fmt.Errorf("bad padding %q", hdr)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &top); err != nil {
		return nil, nil, false, err
	}
	sizes := map[string]int64{"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
		"I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
	data := b[8+n:]
	var meta map[string]string
	hasMeta := false
	type entry struct {
		name       string
		begin, end int64
	}
	var entries []entry
	out := map[string]miniTensor{}
	for k, raw := range top {
		if k == "__metadata__" {
			hasMeta = true
			if err := json.Unmarshal(raw, &meta); err != nil {
				return nil, nil, false, err
			}
			continue
		}
		var e struct {
			DType       string   `json:"dtype"`
			Shape       []int64  `json:"shape"`
			DataOffsets [2]int64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			return nil, nil, false, err
		}
		size, ok := sizes[e.DType]
		if !ok {
			return nil, nil, false, fmt.Errorf("dtype %q", e.DType)
		}
		for _, d := range e.Shape {
			size *= d
		}
		if e.DataOffsets[1]-e.DataOffsets[0] != size || e.DataOffsets[1] > int64(len(data)) {
			return nil, nil, false, fmt.Errorf("%q: offsets %v for %d bytes", k, e.DataOffsets, size)
		}
		entries = append(entries, entry{k, e.DataOffsets[0], e.DataOffsets[1]})
		out[k] = miniTensor{DType: e.DType, Shape: e.Shape, Data: data[e.DataOffsets[0]:e.DataOffsets[1]]}
	}
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].begin != entries[j].begin {
			return entries[i].begin < entries[j].begin
		}
		return entries[i].end < entries[j].end
	})
	var pos int64
	for _, e := range entries {
		if e.begin != pos {
			return nil, nil, false, fmt.Errorf("%q starts at %d, want %d", e.name, e.begin, pos)
		}
		pos = e.end
	}
	if pos != int64(len(data)) {
		return nil, nil, false, fmt.Errorf("data region %d bytes, tensors cover %d", len(data), pos)
	}
	return out, meta, hasMeta, nil
}

func shuffled[T any](rng *rand.Rand, s []T) []T {
	s = slices.Clone(s)
	rng.Shuffle(len(s), func(i, j int) { s[i], s[j] = s[j], s[i] })
	return s
}
