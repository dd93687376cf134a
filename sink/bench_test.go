package sink_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/weightcast/weightcast/safetensors/safetensorstest"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
)

// BenchmarkWriteSafetensors syncs the 1 GiB checkpoint (from the page
// cache) to one receiver that writes it with WriteSafetensors (no fsync),
// against copying the files into a directory with io.Copy in the same run.
// A checkpoint announces each tensor's dtype and shape, so the sink opens
// every file at its first tensor and writes each byte once, in place.
//
//	go test -run '^$' -bench WriteSafetensors -benchtime 3x ./sink
func BenchmarkWriteSafetensors(b *testing.B) {
	if testing.Short() {
		b.Skip("uses a 1 GiB checkpoint")
	}
	dir := safetensorstest.Bench(b, 1<<30, 8)
	paths, fileBytes := safetensorstest.BenchFiles(b, dir)
	var base float64
	b.Run("copy-files", func(b *testing.B) {
		out := b.TempDir()
		b.SetBytes(fileBytes)
		var wall time.Duration
		for b.Loop() {
			t0 := time.Now()
			for _, p := range paths {
				in, err := os.Open(p)
				if err != nil {
					b.Fatal(err)
				}
				o, err := os.Create(filepath.Join(out, filepath.Base(p)))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.Copy(o, in); err != nil {
					b.Fatal(err)
				}
				in.Close()
				o.Close()
			}
			wall += time.Since(t0)
		}
		base = float64(fileBytes) * float64(b.N) / wall.Seconds() / 1e9
		b.ReportMetric(base, "GB/s")
	})
	b.Run("sync", func(b *testing.B) {
		ckpt, err := source.OpenCheckpoint(dir)
		if err != nil {
			b.Fatal(err)
		}
		defer ckpt.Close()
		g := stagestest.NewGroup(b, stagestest.GroupOptions{World: 2, Bucket: 64 << 20})
		files := sink.WriteSafetensors(b.TempDir(), sink.SafetensorsWithoutSync())
		b.SetBytes(ckpt.Size())
		var wall time.Duration
		version := uint64(0)
		for b.Loop() {
			version++
			t0 := time.Now()
			if err := g.Round(context.Background(), ckpt, version, []stages.Sink{files}); err != nil {
				b.Fatal(err)
			}
			wall += time.Since(t0)
		}
		gbs := float64(ckpt.Size()) * float64(b.N) / wall.Seconds() / 1e9
		b.ReportMetric(gbs, "GB/s")
		if base > 0 {
			b.ReportMetric(gbs/base, "x-copy")
		}
	})
}
