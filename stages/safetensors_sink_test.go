package stages

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/safetensors"
)

// TestSafetensorsSinkRounds writes a sharded checkpoint, then a different
// single-file one, into the same directories: the second round replaces
// the first, leaving none of its files.
func TestSafetensorsSinkRounds(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	makeShards(t, a, 21, testShards(), true)
	shardsB := castShards()
	makeShards(t, b, 22, [][]spec{append(shardsB[0], shardsB[1]...)}, false)
	ca, err := OpenCheckpoint(a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb, err := OpenCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	outs := outDirs(t, 3)
	g := newGroup(t, groupOpts{world: 4, bucket: 16 << 10, checksum: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sinks []Sink
	for _, o := range outs {
		sinks = append(sinks, WriteSafetensors(o, SafetensorsWithoutSync()))
	}
	for round, c := range []struct {
		src *Checkpoint
		dir string
	}{{ca, a}, {cb, b}, {ca, a}} {
		if err := g.round(ctx, c.src, uint64(round+1), sinks); err != nil {
			t.Fatal(err)
		}
		for i, o := range outs {
			sameFiles(t, c.dir, o)
			files := sinks[i].(*SafetensorsSink).Files()
			if want := len(dirFiles(t, c.dir)); len(files) != want {
				t.Fatalf("round %d: Files() = %q, want %d files", round+1, files, want)
			}
		}
	}
}

// TestSafetensorsSinkSynthetic writes a source that is not a checkpoint as
// one file, readable by package safetensors, with the tensors in order.
func TestSafetensorsSinkSynthetic(t *testing.T) {
	m, err := Synthetic{Size: 1 << 20, Tensors: 25, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 3}.Model()
	if err != nil {
		t.Fatal(err)
	}
	outs := outDirs(t, 2)
	g := newGroup(t, groupOpts{world: 3, bucket: 64 << 10})
	sinks := []Sink{WriteSafetensors(outs[0]), WriteSafetensors(outs[1], SafetensorsFileName("weights.safetensors"), SafetensorsWithoutSync())}
	if err := g.round(context.Background(), m, 1, sinks); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"model.safetensors", "weights.safetensors"} {
		f, err := safetensors.Open(filepath.Join(outs[i], name))
		if err != nil {
			t.Fatal(err)
		}
		got := f.Tensors()
		if len(got) != len(m.List()) || f.Metadata() != nil {
			t.Fatalf("%d tensors, metadata %v", len(got), f.Metadata())
		}
		for j, want := range m.List() {
			n, _ := want.Size()
			exp, b := make([]byte, n), make([]byte, n)
			if err := want.ReadAt(exp, 0); err != nil {
				t.Fatal(err)
			}
			if err := f.ReadTensor(want.Name, b); err != nil {
				t.Fatal(err)
			}
			if got[j].Name != want.Name || got[j].DType != want.DType || !bytes.Equal(b, exp) {
				t.Fatalf("tensor %d: %s %s, want %s %s (or bytes differ)", j, got[j].Name, got[j].DType, want.Name, want.DType)
			}
		}
		f.Close()
	}
}

// TestSafetensorsSinkMismatch feeds the sink directly with rounds that do
// not match their description: each fails naming the tensor or file, and
// the directory keeps its last good round with nothing left behind.
func TestSafetensorsSinkMismatch(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	info := &SourceInfo{Format: "safetensors", Shards: []ShardInfo{
		{File: "a.safetensors", Tensors: []string{"x", "y"}},
		{File: "b.safetensors", Tensors: []string{"z"}},
	}}
	entry := func(name string, chunk, size, total int64) *Entry {
		return &Entry{Name: name, DType: dtype.U8, Shape: []int64{total}, Size: size, Chunk: chunk, Total: total}
	}
	good := func(s *SafetensorsSink, version uint64) {
		t.Helper()
		if err := s.Begin(ctx, version, info); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"x", "y", "z"} {
			if err := s.Load(ctx, entry(n, 0, 3, 3), []byte(n+n+n)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Commit(ctx, version); err != nil {
			t.Fatal(err)
		}
	}
	s := WriteSafetensors(dir, SafetensorsWithoutSync())
	good(s, 1)
	snapshot := t.TempDir()
	for _, f := range dirFiles(t, dir) {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		os.WriteFile(filepath.Join(snapshot, f), b, 0o644)
	}
	if got := dirFiles(t, dir); strings.Join(got, ",") != "a.safetensors,b.safetensors,model.safetensors.index.json" {
		t.Fatalf("files %q", got)
	}

	cases := []struct {
		name  string
		run   func() error
		wants string
	}{
		{"out of order", func() error {
			return s.Load(ctx, entry("y", 0, 3, 3), []byte("yyy"))
		}, `"y" arrived where a.safetensors expects "x"`},
		{"missing tensor", func() error {
			for _, n := range []string{"x", "y"} {
				if err := s.Load(ctx, entry(n, 0, 3, 3), []byte("aaa")); err != nil {
					return err
				}
			}
			return s.Commit(ctx, 2)
		}, `b.safetensors incomplete: tensor "z" never arrived`},
		{"incomplete tensor", func() error {
			if err := s.Load(ctx, entry("x", 0, 2, 3), []byte("aa")); err != nil {
				return err
			}
			return s.Load(ctx, entry("y", 0, 3, 3), []byte("aaa"))
		}, `"y" arrived while tensor "x" was incomplete`},
		{"extra tensor", func() error {
			for _, n := range []string{"x", "y", "z", "w"} {
				if err := s.Load(ctx, entry(n, 0, 3, 3), []byte("aaa")); err != nil {
					return err
				}
			}
			return nil
		}, `"w" arrived after every file`},
	}
	for _, c := range cases {
		if err := s.Begin(ctx, 2, info); err != nil {
			t.Fatal(err)
		}
		err := c.run()
		if err == nil || !strings.Contains(err.Error(), c.wants) {
			t.Fatalf("%s: %v, want an error containing %s", c.name, err, c.wants)
		}
		if err := s.Abort(); err != nil {
			t.Fatal(err)
		}
		sameFiles(t, snapshot, dir)
	}
	// A description naming files outside the directory is refused.
	for _, bad := range []string{"../evil.safetensors", "sub/a.safetensors", "", stagingPrefix + "x"} {
		err := s.Begin(ctx, 3, &SourceInfo{Shards: []ShardInfo{{File: bad}}})
		if err == nil {
			t.Fatalf("file name %q accepted", bad)
		}
	}
	if err := s.Commit(ctx, 3); err == nil {
		t.Fatal("commit without a round begun")
	}
	sameFiles(t, snapshot, dir)
	// A later good round works after all this.
	good(s, 4)
	sameFiles(t, snapshot, dir)
}
