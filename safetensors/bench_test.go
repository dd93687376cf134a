package safetensors

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

// discard is an io.Writer without ReadFrom, so io.CopyBuffer uses the
// caller's buffer on both sides of the comparison.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// make1GiB writes a 1 GiB checkpoint-like file: tensors of 16 MiB, 4 MiB
// and 8 KiB in turn.
func make1GiB(b *testing.B, dir string) string {
	b.Helper()
	const total = 1 << 30
	var infos []TensorInfo
	var size int64
	sizes := []int64{16 << 20, 4 << 20, 8 << 10}
	for i := 0; size < total; i++ {
		n := min(sizes[i%len(sizes)], total-size)
		infos = append(infos, TensorInfo{Name: fmt.Sprintf("model.layers.%d.weight", i), DType: dtype.BF16, Shape: []int64{n / 2}})
		size += n
	}
	p := filepath.Join(dir, "bench.safetensors")
	w, err := Create(p, infos, map[string]string{"format": "pt"}, WithoutSync())
	if err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	for left := int64(total); left > 0; left -= int64(len(chunk)) {
		if _, err := w.Write(chunk[:min(int64(len(chunk)), left)]); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkRead1GiB compares reading a 1 GiB file from the page cache
// tensor by tensor through this package with a plain sequential io.Copy of
// the same file. Both use a 1 MiB buffer.
func BenchmarkRead1GiB(b *testing.B) {
	if testing.Short() {
		b.Skip("writes a 1 GiB file")
	}
	p := make1GiB(b, b.TempDir())
	st, err := os.Stat(p)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	plain := func() {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if _, err := io.CopyBuffer(discard{}, struct{ io.Reader }{f}, buf); err != nil {
			b.Fatal(err)
		}
	}
	plain() // warm the page cache
	report := func(b *testing.B, bytes int64) {
		b.ReportMetric(float64(bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	}
	b.Run("tensors", func(b *testing.B) {
		b.SetBytes(st.Size())
		for b.Loop() {
			f, err := Open(p)
			if err != nil {
				b.Fatal(err)
			}
			for _, t := range f.Tensors() {
				sec, err := f.Section(t.Name)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.CopyBuffer(discard{}, sec, buf); err != nil {
					b.Fatal(err)
				}
			}
			f.Close()
		}
		report(b, st.Size())
	})
	b.Run("iocopy", func(b *testing.B) {
		b.SetBytes(st.Size())
		for b.Loop() {
			plain()
		}
		report(b, st.Size())
	})
}
