package safetensors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const shardedRef = "testdata/reference/sharded_transformers"

func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// copyModel writes m again into dir with the same layout.
func copyModel(t *testing.T, m *Model, dir string) {
	t.Helper()
	w, err := CreateModel(dir, m.Layout(), WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range shuffled(rand.New(rand.NewPCG(1, 1)), m.Tensors()) {
		sec, err := m.Section(tn.Name)
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

func TestReferenceShardedRoundTrip(t *testing.T) {
	m, err := OpenModel(shardedRef)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Len() != 16 || len(m.Shards()) != 5 {
		t.Fatalf("%d tensors in %d shards, want 16 in 5", m.Len(), len(m.Shards()))
	}
	if !slices.IsSorted(m.ShardNames()) || m.IndexPath() != filepath.Join(shardedRef, IndexFileName) {
		t.Fatalf("shards %v, index %q", m.ShardNames(), m.IndexPath())
	}
	prev := ModelTensor{Shard: -1}
	for _, tn := range m.Tensors() {
		if tn.Shard < prev.Shard || (tn.Shard == prev.Shard && tn.Offset < prev.Offset) {
			t.Fatalf("%q (shard %d, offset %d) after %q (shard %d, offset %d)", tn.Name, tn.Shard, tn.Offset, prev.Name, prev.Shard, prev.Offset)
		}
		prev = tn
	}
	if got := m.Index().Metadata["total_size"]; got != json.Number("4320") {
		t.Fatalf("total_size %v", got)
	}
	out := t.TempDir()
	copyModel(t, m, out)
	entries, _ := os.ReadDir(out)
	if len(entries) != 6 {
		t.Fatalf("wrote %d files, want 5 shards and the index", len(entries))
	}
	for _, e := range entries {
		sameFile(t, filepath.Join(shardedRef, e.Name()), filepath.Join(out, e.Name()))
	}
}

func TestOpenModelForms(t *testing.T) {
	for _, p := range []string{filepath.Join(shardedRef, IndexFileName), shardedRef} {
		m, err := OpenModel(p)
		if err != nil {
			t.Fatal(err)
		}
		if m.Len() != 16 {
			t.Fatalf("%s: %d tensors", p, m.Len())
		}
		m.Close()
	}
	one := filepath.Join(shardedRef, "model-00003-of-00005.safetensors")
	m, err := OpenModel(one)
	if err != nil {
		t.Fatal(err)
	}
	if m.Len() != 1 || m.IndexPath() != "" || m.Index() != nil {
		t.Fatalf("single file: %d tensors, index %q", m.Len(), m.IndexPath())
	}
	b := make([]byte, 1024)
	if err := m.ReadTensor("transformer.h.0.mlp.c_fc.weight", b); err != nil {
		t.Fatal(err)
	}
	m.Close()

	// A directory without an index: every .safetensors file, sorted.
	dir := copyDir(t, shardedRef)
	os.Remove(filepath.Join(dir, IndexFileName))
	m, err = OpenModel(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Len() != 16 || m.IndexPath() != "" {
		t.Fatalf("no index: %d tensors, index %q", m.Len(), m.IndexPath())
	}
	out := t.TempDir()
	copyModel(t, m, out)
	if _, err := os.Stat(filepath.Join(out, IndexFileName)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("an index was written for a model without one: %v", err)
	}
}

func editIndex(t *testing.T, dir string, edit func(wm map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, IndexFileName)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var idx map[string]any
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	edit(idx["weight_map"].(map[string]any))
	b, _ = json.Marshal(idx)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenModelRejects(t *testing.T) {
	const (
		s1 = "model-00001-of-00005.safetensors"
		s2 = "model-00002-of-00005.safetensors"
		s3 = "model-00003-of-00005.safetensors"
	)
	cases := []struct {
		name   string
		setup  func(t *testing.T, dir string)
		want   error
		tensor string
		file   string // base name the error's File must have
	}{
		{"missing shard", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, s3)) },
			ErrMissingShard, "transformer.h.0.mlp.c_fc.weight", s3},
		{"weight_map names the wrong shard", func(t *testing.T, dir string) {
			editIndex(t, dir, func(wm map[string]any) { wm["transformer.wte.weight"] = s2 })
		}, ErrIndexMismatch, "transformer.wte.weight", IndexFileName},
		{"weight_map lacks a tensor", func(t *testing.T, dir string) {
			editIndex(t, dir, func(wm map[string]any) { delete(wm, "transformer.wpe.weight") })
		}, ErrIndexMismatch, "transformer.wpe.weight", IndexFileName},
		{"weight_map lists a tensor no shard has", func(t *testing.T, dir string) {
			editIndex(t, dir, func(wm map[string]any) { wm["ghost"] = s1 })
		}, ErrIndexMismatch, "ghost", IndexFileName},
		{"shard outside the directory", func(t *testing.T, dir string) {
			editIndex(t, dir, func(wm map[string]any) { wm["transformer.wte.weight"] = "../" + s1 })
		}, ErrIndex, "transformer.wte.weight", IndexFileName},
		{"index not JSON", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexFileName), []byte("{"), 0o644)
		}, ErrIndex, "", IndexFileName},
		{"index without weight_map", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexFileName), []byte(`{"metadata":{}}`), 0o644)
		}, ErrIndex, "", IndexFileName},
		{"several indexes", func(t *testing.T, dir string) {
			os.Rename(filepath.Join(dir, IndexFileName), filepath.Join(dir, "a.safetensors.index.json"))
			os.WriteFile(filepath.Join(dir, "b.safetensors.index.json"), []byte(`{}`), 0o644)
		}, ErrIndex, "", ""},
		{"same tensor in two shards", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, IndexFileName))
			b, _ := os.ReadFile(filepath.Join(dir, s1))
			os.WriteFile(filepath.Join(dir, "model-00009-of-00009.safetensors"), b, 0o644)
		}, ErrDuplicate, "transformer.h.0.ln_1.bias", "model-00009-of-00009.safetensors"},
		{"a malformed shard", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, s2), []byte("\x02\x00\x00\x00\x00\x00\x00\x00{]"), 0o644)
		}, ErrHeaderJSON, "", s2},
		{"empty directory", func(t *testing.T, dir string) {
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				os.Remove(filepath.Join(dir, e.Name()))
			}
		}, fs.ErrNotExist, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyDir(t, shardedRef)
			c.setup(t, dir)
			m, err := OpenModel(dir)
			if err == nil {
				m.Close()
				t.Fatalf("OpenModel succeeded, want %v", c.want)
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("%v, want %v", err, c.want)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("%T is not *Error", err)
			}
			if e.Tensor != c.tensor {
				t.Errorf("names tensor %q, want %q: %v", e.Tensor, c.tensor, err)
			}
			if c.file != "" && filepath.Base(e.File) != c.file {
				t.Errorf("names file %q, want %s: %v", e.File, c.file, err)
			}
		})
	}
}

func TestPlanShardsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	infos, data, _ := randomLayout(rng, 25)
	meta := map[string]string{"format": "pt"}
	for _, max := range []int64{1, 40, 1 << 30} {
		l, err := PlanShards(infos, meta, max)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		w, err := CreateModel(dir, l, WithoutSync())
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
		m, err := OpenModel(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Shards) == 1 {
			if m.IndexPath() != "" || m.ShardNames()[0] != "model.safetensors" {
				t.Fatalf("max %d: one shard, index %q, names %v", max, m.IndexPath(), m.ShardNames())
			}
		} else if m.IndexPath() == "" || m.Index().Metadata["total_size"] == nil {
			t.Fatalf("max %d: %d shards but no index", max, len(l.Shards))
		}
		got := m.Tensors()
		if len(got) != len(infos) {
			t.Fatalf("max %d: %d tensors, want %d", max, len(got), len(infos))
		}
		for i, tn := range got {
			if tn.Name != infos[i].Name {
				t.Fatalf("max %d: tensor %d is %q, want %q", max, i, tn.Name, infos[i].Name)
			}
			b := make([]byte, tn.Size)
			if err := m.ReadTensor(tn.Name, b); err != nil || !bytes.Equal(b, data[tn.Name]) {
				t.Fatalf("max %d: %q differs (%v)", max, tn.Name, err)
			}
		}
		m.Close()
	}
}

func TestIndexMarshalLikePython(t *testing.T) {
	idx := &Index{
		Metadata:  map[string]any{"total_size": json.Number("12"), "b": []any{true, nil, json.Number("1.5e-05")}, "e": map[string]any{}},
		WeightMap: map[string]string{"é😀\x7f\"\\\n": "x.safetensors", "a": "y.safetensors"},
	}
	// json.dumps(idx, indent=2, sort_keys=True) + "\n"
	want := `{
  "metadata": {
    "b": [
      true,
      null,
      1.5e-05
    ],
    "e": {},
    "total_size": 12
  },
  "weight_map": {
    "a": "y.safetensors",
    "\u00e9\ud83d\ude00\u007f\"\\\n": "x.safetensors"
  }
}
`
	if got := string(idx.Marshal()); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
	back, err := ParseIndex([]byte(want))
	if err != nil {
		t.Fatal(err)
	}
	if back.WeightMap["é😀\x7f\"\\\n"] != "x.safetensors" || !strings.Contains(string(back.Marshal()), `"total_size": 12`) {
		t.Fatalf("parsed back %+v", back)
	}
}

func TestCreateModelRejects(t *testing.T) {
	dir := t.TempDir()
	bad := []ModelLayout{
		{Shards: []ShardLayout{{Name: "../x.safetensors"}}},
		{Shards: []ShardLayout{{Name: "a.safetensors"}, {Name: "a.safetensors"}}},
		{Shards: []ShardLayout{{Name: "a.safetensors", Tensors: twoTensors()}, {Name: "b.safetensors", Tensors: twoTensors()}}},
		{Shards: []ShardLayout{{Name: "a.safetensors"}}, IndexName: "../i.json"},
	}
	for i, l := range bad {
		if w, err := CreateModel(dir, l); err == nil {
			w.Abort()
			t.Errorf("layout %d accepted", i)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("left behind %v", entries)
	}
}
