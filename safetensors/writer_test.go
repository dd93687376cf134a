package safetensors

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

func TestWriterSequentialChunks(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	infos, data, meta := randomLayout(rng, 8)
	p := filepath.Join(t.TempDir(), "seq.safetensors")
	w, err := Create(p, infos, meta, WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for _, ti := range infos {
		all = append(all, data[ti.Name]...)
	}
	for len(all) > 0 {
		n := min(len(all), 1+rng.IntN(7))
		if m, err := w.Write(all[:n]); err != nil || m != n {
			t.Fatalf("Write: %d, %v", m, err)
		}
		all = all[n:]
	}
	if _, err := w.Write([]byte{1}); !errors.Is(err, ErrWrite) {
		t.Fatalf("write past the end: %v, want ErrWrite", err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, _, _, err := miniRead(p)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range data {
		if !bytes.Equal(got[name].Data, b) {
			t.Fatalf("%q differs", name)
		}
	}
}

func TestWriterConcurrentWriteAt(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	infos, data, _ := randomLayout(rng, 30)
	p := filepath.Join(t.TempDir(), "par.safetensors")
	w, err := Create(p, infos, nil, WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	type chunk struct {
		off int64
		b   []byte
	}
	var chunks []chunk
	for _, tn := range w.Tensors() {
		b := data[tn.Name]
		for off := 0; off < len(b); {
			n := min(len(b)-off, 1+rng.IntN(5))
			chunks = append(chunks, chunk{tn.Offset + int64(off), b[off : off+n]})
			off += n
		}
	}
	chunks = shuffled(rng, chunks)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < len(chunks); i += 4 {
				if _, err := w.WriteAt(chunks[i].b, chunks[i].off); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tn := range f.Tensors() {
		b := make([]byte, tn.Size)
		if err := f.ReadTensor(tn.Name, b); err != nil || !bytes.Equal(b, data[tn.Name]) {
			t.Fatalf("%q differs (%v)", tn.Name, err)
		}
	}
}

func twoTensors() []TensorInfo {
	return []TensorInfo{
		{Name: "a", DType: dtype.F32, Shape: []int64{2}},
		{Name: "b", DType: dtype.U8, Shape: []int64{3}},
	}
}

func TestWriterMisuse(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "w.safetensors")
	w, err := Create(p, twoTensors(), nil, WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if err := w.WriteTensorAt("a", make([]byte, 4), 6); !errors.Is(err, ErrWrite) {
		t.Errorf("write past the tensor: %v", err)
	}
	if err := w.WriteTensorAt("nope", []byte{1}, 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown tensor: %v", err)
	}
	if err := w.WriteTensorAt("a", make([]byte, 4), 2); err != nil {
		t.Fatal(err)
	}
	err = w.WriteTensorAt("a", make([]byte, 2), 4)
	if !errors.Is(err, ErrWrite) || !strings.Contains(err.Error(), `"a"`) {
		t.Errorf("overlapping write: %v", err)
	}
	if _, err := w.WriteAt([]byte{1}, 0); !errors.Is(err, ErrWrite) {
		t.Errorf("write into the header: %v", err)
	}
	if _, err := w.WriteAt([]byte{1}, w.Size()); !errors.Is(err, ErrWrite) {
		t.Errorf("write past the data: %v", err)
	}
}

func TestWriterCloseIncomplete(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "w.safetensors")
	w, err := Create(p, twoTensors(), nil, WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensorAt("a", make([]byte, 8), 0); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensorAt("b", []byte{1}, 0); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensorAt("b", []byte{3}, 2); err != nil {
		t.Fatal(err)
	}
	err = w.Close()
	var e *Error
	if !errors.Is(err, ErrIncomplete) || !errors.As(err, &e) || e.Tensor != "b" || e.File != p {
		t.Fatalf("Close: %v, want ErrIncomplete naming b and %s", err, p)
	}
	if err2 := w.Close(); err2 != err {
		t.Errorf("second Close returned %v, want the first result", err2)
	}
	if err := w.WriteTensorAt("b", []byte{2}, 1); !errors.Is(err, ErrWrite) {
		t.Errorf("write after Close: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("left behind %v", entries)
	}
}

func TestWriterAbortKeepsOldFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "w.safetensors")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := Create(p, twoTensors(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("destination changed to %q", b)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("left behind %v", entries)
	}
}

func TestCreateRejects(t *testing.T) {
	cases := []struct {
		name  string
		infos []TensorInfo
		meta  map[string]string
		opts  []Option
		want  error
	}{
		{"empty name", []TensorInfo{{Name: "", DType: dtype.U8}}, nil, nil, ErrName},
		{"reserved name", []TensorInfo{{Name: MetadataKey, DType: dtype.U8}}, nil, nil, ErrName},
		{"bad utf8", []TensorInfo{{Name: "\xff", DType: dtype.U8}}, nil, nil, ErrName},
		{"duplicate", []TensorInfo{{Name: "a", DType: dtype.U8}, {Name: "a", DType: dtype.U8}}, nil, nil, ErrDuplicate},
		{"negative dim", []TensorInfo{{Name: "a", DType: dtype.U8, Shape: []int64{2, -1}}}, nil, nil, ErrNegativeDim},
		{"invalid dtype", []TensorInfo{{Name: "a", DType: dtype.Invalid}}, nil, nil, ErrDType},
		{"overflow", []TensorInfo{{Name: "a", DType: dtype.F64, Shape: []int64{1 << 40, 1 << 40}}}, nil, nil, ErrShape},
		{"too many", twoTensors(), nil, []Option{WithLimits(Limits{MaxTensors: 1})}, ErrLimit},
		{"metadata order missing a key", nil, map[string]string{"a": "1", "b": "2"}, []Option{WithMetadataOrder([]string{"a"})}, ErrHeaderJSON},
		{"metadata order with a stranger", nil, map[string]string{"a": "1"}, []Option{WithMetadataOrder([]string{"z"})}, ErrHeaderJSON},
		{"metadata order twice", nil, map[string]string{"a": "1", "b": "2"}, []Option{WithMetadataOrder([]string{"a", "a"})}, ErrHeaderJSON},
		{"header over limit", twoTensors(), nil, []Option{WithLimits(Limits{MaxHeaderBytes: 16})}, ErrHeaderSize},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			w, err := Create(filepath.Join(dir, "x.safetensors"), c.infos, c.meta, c.opts...)
			if err == nil {
				w.Abort()
				t.Fatalf("Create succeeded, want %v", c.want)
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("%v, want %v", err, c.want)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Fatalf("left behind %v", entries)
			}
		})
	}
}

func TestCopyTensorShortSource(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.safetensors")
	w, err := Create(p, twoTensors(), nil, WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if _, err := w.CopyTensor(context.Background(), "a", bytes.NewReader(make([]byte, 5))); !errors.Is(err, ErrWrite) {
		t.Fatalf("short source: %v", err)
	}
}

func TestSpans(t *testing.T) {
	var s spans
	for _, r := range [][2]int64{{4, 6}, {0, 2}, {2, 4}, {8, 9}, {6, 8}} {
		if err := s.add(r[0], r[1]); err != nil {
			t.Fatal(err)
		}
	}
	if len(s) != 1 || s[0] != (span{0, 9}) {
		t.Fatalf("spans %v", s)
	}
	if err := s.add(8, 10); err == nil {
		t.Fatal("overlap accepted")
	}
	if g, ok := s.firstGap(12); !ok || g != 9 {
		t.Fatalf("gap %d %v", g, ok)
	}
	if _, ok := s.firstGap(9); ok {
		t.Fatal("gap in a full set")
	}
}

func TestCopyTensorCancelled(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.safetensors")
	w, err := Create(p, []TensorInfo{{Name: "big", DType: dtype.U8, Shape: []int64{3 << 20}}}, nil, WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	ctx, cancel := context.WithCancel(context.Background())
	r := &cancelAfter{n: 1 << 20, cancel: cancel}
	n, err := w.CopyTensor(ctx, "big", r)
	if !errors.Is(err, context.Canceled) || n != 1<<20 {
		t.Fatalf("copied %d bytes, error %v; want 1 MiB and context.Canceled", n, err)
	}
}

// cancelAfter reads zeros and cancels once n bytes have been read.
type cancelAfter struct {
	n, done int
	cancel  func()
}

func (c *cancelAfter) Read(p []byte) (int, error) {
	clear(p)
	c.done += len(p)
	if c.done >= c.n {
		c.cancel()
	}
	return len(p), nil
}
