package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

// The files under testdata/reference were written by the Python safetensors
// package (testdata/make_reference.py).
func TestReferenceFilesRoundTrip(t *testing.T) {
	for _, name := range []string{"mixed", "empty", "numpy_nometa"} {
		t.Run(name, func(t *testing.T) {
			src := filepath.Join("testdata", "reference", name+".safetensors")
			f, err := Open(src)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			dst := filepath.Join(t.TempDir(), name+".safetensors")
			rewrite(t, f, dst)
			sameFile(t, src, dst)
		})
	}
}

func TestReferenceMixedContents(t *testing.T) {
	f, err := Open(filepath.Join("testdata", "reference", "mixed.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := f.MetadataKeys(); !slices.Equal(got, []string{"note", "format"}) {
		t.Errorf("metadata keys %q, want the file's order [note format]", got)
	}
	if m := f.Metadata(); m["format"] != "pt" || m["note"] != "a \"b\" <c> é\n" {
		t.Errorf("metadata %q", m)
	}
	read := func(name string) []byte {
		t.Helper()
		tn, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("no tensor %q", name)
		}
		b := make([]byte, tn.Size)
		if err := f.ReadTensor(name, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	pos := read("position_ids")
	for i := range 5 {
		if v := binary.LittleEndian.Uint64(pos[8*i:]); v != uint64(i) {
			t.Errorf("position_ids[%d] = %d", i, v)
		}
	}
	if m := read("mask"); !bytes.Equal(m, []byte{1, 0, 1}) {
		t.Errorf("mask %v", m)
	}
	if s := read("scalar"); math.Float32frombits(binary.LittleEndian.Uint32(s)) != 3.5 {
		t.Errorf("scalar %v", s)
	}
	sc, _ := f.Tensor("scalar")
	if len(sc.Shape) != 0 || sc.DType != dtype.F32 {
		t.Errorf("scalar %+v", sc)
	}
	ea, _ := f.Tensor("empty_a")
	if ea.Size != 0 || !slices.Equal(ea.Shape, []int64{0, 3}) {
		t.Errorf("empty_a %+v", ea)
	}
	for _, name := range []string{"quote \" and \\ backslash", "unicodé/名前 \u2028 <&>", "tab\there\nnew\x01ctl\x7f"} {
		if _, ok := f.Tensor(name); !ok {
			t.Errorf("no tensor %q", name)
		}
	}
	// Offsets ascend and are contiguous.
	prev := f.DataOffset()
	for _, tn := range f.Tensors() {
		if tn.Offset != prev {
			t.Fatalf("%q at %d, want %d", tn.Name, tn.Offset, prev)
		}
		prev += tn.Size
	}
	if prev != f.Size() {
		t.Fatalf("tensors end at %d, file is %d", prev, f.Size())
	}
}

func TestSortLikeReference(t *testing.T) {
	f, err := Open(filepath.Join("testdata", "reference", "mixed.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := f.Infos()
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		got := shuffled(rng, want)
		SortLikeReference(got)
		for i := range got {
			if got[i].Name != want[i].Name {
				t.Fatalf("position %d: %q, want %q", i, got[i].Name, want[i].Name)
			}
		}
	}
}

// Byte strings from the reference implementation's own unit tests
// (test_serialization, test_serialization_forced_alignement, test_empty).
func TestGoldenBytes(t *testing.T) {
	f32s := func(v ...float32) []byte {
		var b []byte
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
		return b
	}
	file := func(n uint64, hdr string, data []byte) []byte {
		b := binary.LittleEndian.AppendUint64(nil, n)
		return append(append(b, hdr...), data...)
	}
	data := f32s(0, 1, 2, 3, 4, 5)
	cases := []struct {
		name   string
		infos  []TensorInfo
		meta   map[string]string
		want   []byte
		tensor []byte
	}{
		{"attn.0", []TensorInfo{{Name: "attn.0", DType: dtype.F32, Shape: []int64{1, 2, 3}}}, nil,
			file(64, `{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, data), data},
		{"forced alignment", []TensorInfo{{Name: "attn0", DType: dtype.F32, Shape: []int64{1, 1, 2, 3}}}, nil,
			file(72, `{"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       `, data), data},
		{"empty", nil, nil, file(8, `{}      `, nil), nil},
		{"empty with metadata", nil, map[string]string{"framework": "pt"},
			file(40, `{"__metadata__":{"framework":"pt"}}     `, nil), nil},
		{"no tensors, empty metadata map (valid JSON, unlike the reference)", nil, map[string]string{},
			file(24, `{"__metadata__":{}}     `, nil), nil},
		{"empty metadata map", []TensorInfo{{Name: "a", DType: dtype.U8, Shape: []int64{1}}}, map[string]string{},
			file(72, `{"__metadata__":{},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}} `, []byte{7}), []byte{7}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "x.safetensors")
			data := map[string][]byte{}
			if len(c.infos) > 0 {
				data[c.infos[0].Name] = c.tensor
			}
			writeAll(t, p, c.infos, data, c.meta)
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.want) {
				t.Fatalf("got\n%q\nwant\n%q", got, c.want)
			}
		})
	}
}

// A file written by this package, read back and written again with the
// same order and metadata, is the same file; the order is the given one.
func TestWriterRoundTripRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	dir := t.TempDir()
	for i := range 60 {
		infos, data, meta := randomLayout(rng, rng.IntN(12))
		var opts []Option
		if meta != nil && rng.IntN(2) == 0 {
			keys := make([]string, 0, len(meta))
			for k := range meta {
				keys = append(keys, k)
			}
			opts = append(opts, WithMetadataOrder(shuffled(rng, keys)))
		}
		a := filepath.Join(dir, "a.safetensors")
		writeAll(t, a, infos, data, meta, opts...)
		f, err := Open(a)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		got := f.Tensors()
		if len(got) != len(infos) {
			t.Fatalf("case %d: %d tensors, want %d", i, len(got), len(infos))
		}
		for j, tn := range got {
			if tn.Name != infos[j].Name || tn.DType != infos[j].DType || !slices.Equal(tn.Shape, infos[j].Shape) {
				t.Fatalf("case %d: tensor %d is %+v, want %+v", i, j, tn, infos[j])
			}
			b := make([]byte, tn.Size)
			if err := f.ReadTensor(tn.Name, b); err != nil || !bytes.Equal(b, data[tn.Name]) {
				t.Fatalf("case %d: %q data differs (%v)", i, tn.Name, err)
			}
		}
		if (meta == nil) != (f.Metadata() == nil) || len(meta) != len(f.Metadata()) {
			t.Fatalf("case %d: metadata %v, want %v", i, f.Metadata(), meta)
		}
		b := filepath.Join(dir, "b.safetensors")
		rewrite(t, f, b)
		f.Close()
		sameFile(t, a, b)
	}
}

// The independent reader reads what the writer wrote.
func TestMiniReaderReadsWriterOutput(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	dir := t.TempDir()
	for i := range 40 {
		infos, data, meta := randomLayout(rng, rng.IntN(10))
		p := filepath.Join(dir, "m.safetensors")
		writeAll(t, p, shuffled(rng, infos), data, meta)
		got, gotMeta, hasMeta, err := miniRead(p)
		if err != nil {
			t.Fatalf("case %d: mini reader: %v", i, err)
		}
		if len(got) != len(infos) {
			t.Fatalf("case %d: %d tensors, want %d", i, len(got), len(infos))
		}
		for _, ti := range infos {
			g, ok := got[ti.Name]
			if !ok {
				t.Fatalf("case %d: mini reader misses %q", i, ti.Name)
			}
			if g.DType != ti.DType.String() || !slices.Equal(g.Shape, ti.Shape) || !bytes.Equal(g.Data, data[ti.Name]) {
				t.Fatalf("case %d: %q read as %s %v", i, ti.Name, g.DType, g.Shape)
			}
		}
		if hasMeta != (meta != nil) || len(gotMeta) != len(meta) {
			t.Fatalf("case %d: metadata %v (present %v), want %v", i, gotMeta, hasMeta, meta)
		}
		for k, v := range meta {
			if gotMeta[k] != v {
				t.Fatalf("case %d: metadata[%q] = %q, want %q", i, k, gotMeta[k], v)
			}
		}
	}
}

// save_file({}, metadata={}) in safetensors 0.8.0 writes a header that is
// not JSON; the reader says so.
func TestReferenceEmptyMetadataQuirk(t *testing.T) {
	f, err := Open(filepath.Join("testdata", "reference", "empty_meta.safetensors"))
	if err == nil {
		f.Close()
		t.Fatal("opened a header that is not JSON")
	}
	if !errors.Is(err, ErrHeaderJSON) {
		t.Fatalf("%v, want ErrHeaderJSON", err)
	}
}
