package sink_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/safetensors"
	"github.com/weightcast/weightcast/safetensors/safetensorstest"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
	"github.com/weightcast/weightcast/wire"
)

// TestSafetensorsSinkRounds writes a sharded checkpoint, then a different
// single-file one, into the same directories: the second round replaces
// the first, leaving none of its files.
func TestSafetensorsSinkRounds(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	safetensorstest.Write(t, a, 21, safetensorstest.Shards(), true)
	shardsB := safetensorstest.CastShards()
	safetensorstest.Write(t, b, 22, [][]safetensorstest.Spec{append(shardsB[0], shardsB[1]...)}, false)
	ca, err := source.OpenCheckpoint(a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb, err := source.OpenCheckpoint(b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	outs := safetensorstest.OutDirs(t, 3)
	g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 4, Bucket: 16 << 10, Checksum: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sinks []stages.Sink
	for _, o := range outs {
		sinks = append(sinks, sink.WriteSafetensors(o, sink.SafetensorsWithoutSync()))
	}
	for round, c := range []struct {
		src *source.Checkpoint
		dir string
	}{{ca, a}, {cb, b}, {ca, a}} {
		if err := g.Round(ctx, c.src, uint64(round+1), sinks); err != nil {
			t.Fatal(err)
		}
		for i, o := range outs {
			safetensorstest.SameFiles(t, c.dir, o)
			files := sinks[i].(*sink.Safetensors).Files()
			if want := len(safetensorstest.DirFiles(t, c.dir)); len(files) != want {
				t.Fatalf("round %d: Files() = %q, want %d files", round+1, files, want)
			}
		}
	}
}

// TestSafetensorsSinkSynthetic writes a source that is not a checkpoint as
// one file, readable by package safetensors, with the tensors in order.
func TestSafetensorsSinkSynthetic(t *testing.T) {
	m, err := source.Synthetic{Size: 1 << 20, Tensors: 25, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 3}.Model()
	if err != nil {
		t.Fatal(err)
	}
	outs := safetensorstest.OutDirs(t, 2)
	g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 3, Bucket: 64 << 10})
	sinks := []stages.Sink{sink.WriteSafetensors(outs[0]), sink.WriteSafetensors(outs[1], sink.SafetensorsFileName("weights.safetensors"), sink.SafetensorsWithoutSync())}
	if err := g.Round(context.Background(), m, 1, sinks); err != nil {
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
	info := &wire.SourceInfo{Format: "safetensors", Shards: []wire.ShardInfo{
		{File: "a.safetensors", Tensors: []string{"x", "y"}},
		{File: "b.safetensors", Tensors: []string{"z"}},
	}}
	entry := func(name string, chunk, size, total int64) *wire.Entry {
		return &wire.Entry{Name: name, DType: dtype.U8, Shape: []int64{total}, Size: size, Chunk: chunk, Total: total}
	}
	good := func(s *sink.Safetensors, version uint64) {
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
		if err := s.Committed(ctx, version); err != nil {
			t.Fatal(err)
		}
	}
	s := sink.WriteSafetensors(dir, sink.SafetensorsWithoutSync())
	good(s, 1)
	snapshot := t.TempDir()
	for _, f := range safetensorstest.DirFiles(t, dir) {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		os.WriteFile(filepath.Join(snapshot, f), b, 0o644)
	}
	if got := safetensorstest.DirFiles(t, dir); strings.Join(got, ",") != "a.safetensors,b.safetensors,model.safetensors.index.json" {
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
		safetensorstest.SameFiles(t, snapshot, dir)
	}
	// A description naming files outside the directory is refused.
	for _, bad := range []string{"../evil.safetensors", "sub/a.safetensors", "", sink.StagingPrefix + "x"} {
		err := s.Begin(ctx, 3, &wire.SourceInfo{Shards: []wire.ShardInfo{{File: bad}}})
		if err == nil {
			t.Fatalf("file name %q accepted", bad)
		}
	}
	if err := s.Commit(ctx, 3); err == nil {
		t.Fatal("commit without a round begun")
	}
	safetensorstest.SameFiles(t, snapshot, dir)
	// A later good round works after all this.
	good(s, 4)
	safetensorstest.SameFiles(t, snapshot, dir)
}

// TestSafetensorsSinkAnnounced feeds the sink a description with dtypes and
// shapes: it writes each file in place from its first tensor on (no spool
// file), the files are byte-identical to those of a description without
// them, and a tensor that arrives unlike its announcement fails the round.
func TestSafetensorsSinkAnnounced(t *testing.T) {
	ctx := context.Background()
	names := func() wire.ShardInfo { return wire.ShardInfo{File: "a.safetensors", Tensors: []string{"x", "y"}} }
	plain := &wire.SourceInfo{Format: "safetensors", Metadata: map[string]string{"format": "pt"}, MetadataKeys: []string{"format"},
		Shards: []wire.ShardInfo{names(), {File: "b.safetensors", Tensors: []string{"z"}}}}
	announced := *plain
	announced.Shards = []wire.ShardInfo{names(), {File: "b.safetensors", Tensors: []string{"z"}}}
	announced.Shards[0].DTypes, announced.Shards[0].Shapes = []dtype.DType{dtype.U8, dtype.I16}, [][]int64{{3}, {2, 2}}
	announced.Shards[1].DTypes, announced.Shards[1].Shapes = []dtype.DType{dtype.U8}, [][]int64{{}}
	type load struct {
		e    wire.Entry
		data string
	}
	loads := []load{
		{wire.Entry{Name: "x", DType: dtype.U8, Shape: []int64{3}, Size: 2, Total: 3}, "xx"},
		{wire.Entry{Name: "x", DType: dtype.U8, Shape: []int64{3}, Size: 1, Chunk: 2, Total: 3}, "x"},
		{wire.Entry{Name: "y", DType: dtype.I16, Shape: []int64{2, 2}, Size: 8, Total: 8}, "yyyyyyyy"},
		{wire.Entry{Name: "z", DType: dtype.U8, Shape: []int64{}, Size: 1, Total: 1}, "z"},
	}
	write := func(info *wire.SourceInfo) string {
		t.Helper()
		dir := t.TempDir()
		s := sink.WriteSafetensors(dir, sink.SafetensorsWithoutSync())
		if err := s.Begin(ctx, 1, info); err != nil {
			t.Fatal(err)
		}
		for i, l := range loads {
			if err := s.Load(ctx, &l.e, []byte(l.data)); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				staged, _ := filepath.Glob(filepath.Join(dir, sink.StagingPrefix+"*", ".*"))
				spilled := slices.ContainsFunc(staged, func(p string) bool { return strings.HasPrefix(filepath.Base(p), ".spill-") })
				if spilled != (info == plain) {
					t.Fatalf("after the first chunk the round's directory holds %q; spooled %v, want %v", staged, spilled, info == plain)
				}
			}
		}
		if err := s.Commit(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Committed(ctx, 1); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	want, got := write(plain), write(&announced)
	safetensorstest.SameFiles(t, want, got)
	if meta, tensors := safetensorstest.ReadRaw(t, filepath.Join(got, "a.safetensors")); meta["format"] != "pt" || tensors["y"].DType != "I16" || string(tensors["y"].Data) != "yyyyyyyy" {
		t.Fatalf("a.safetensors: metadata %v, tensors %v", meta, tensors)
	}

	dir := t.TempDir()
	s := sink.WriteSafetensors(dir, sink.SafetensorsWithoutSync())
	cases := []struct {
		name  string
		e     wire.Entry
		wants string
	}{
		{"dtype", wire.Entry{Name: "x", DType: dtype.I8, Shape: []int64{3}, Size: 3, Total: 3}, `tensor "x" arrived as I8[3], but the round's source description announces it as U8[3] in a.safetensors`},
		{"shape", wire.Entry{Name: "x", DType: dtype.U8, Shape: []int64{1, 3}, Size: 3, Total: 3}, `tensor "x" arrived as U8[1 3], but the round's source description announces it as U8[3]`},
	}
	for _, c := range cases {
		if err := s.Begin(ctx, 2, &announced); err != nil {
			t.Fatal(err)
		}
		if err := s.Load(ctx, &c.e, []byte("xxx")); err == nil || !strings.Contains(err.Error(), c.wants) {
			t.Fatalf("%s: %v, want an error containing %s", c.name, err, c.wants)
		}
		if err := s.Abort(); err != nil {
			t.Fatal(err)
		}
		if left := safetensorstest.DirFiles(t, dir); len(left) != 0 {
			t.Fatalf("%s: the failed round left %q", c.name, left)
		}
	}
	// A malformed announcement is refused at Begin.
	bad := announced
	bad.Shards = slices.Clone(announced.Shards)
	bad.Shards[0].DTypes = bad.Shards[0].DTypes[:1]
	if err := s.Begin(ctx, 3, &bad); err == nil || !strings.Contains(err.Error(), "2 tensors in a.safetensors with 1 dtypes and 2 shapes") {
		t.Fatalf("short dtypes: %v", err)
	}
	bad.Shards[0].DTypes, bad.Shards[0].Shapes = announced.Shards[0].DTypes, [][]int64{{3}, {-1}}
	if err := s.Begin(ctx, 3, &bad); err == nil || !strings.Contains(err.Error(), `tensor "y" in a.safetensors as I16[-1]`) {
		t.Fatalf("negative dimension: %v", err)
	}
	s.Abort()
}
