package gpu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// nullStaging is a stagingGPU that copies nothing: slots in Go memory,
// copies dropped, events complete at once.
type nullStaging struct{}

type doneEvent struct{}

func (doneEvent) Query() (bool, error) { return true, nil }
func (doneEvent) Close() error         { return nil }

func (nullStaging) alloc(n int) ([]byte, uint64, func() error, error) {
	return make([]byte, n), 1 << 40, func() error { return nil }, nil
}
func (nullStaging) queue(context.Context, []stageCopy) error { return nil }
func (nullStaging) record() (stagingEvent, error)            { return doneEvent{}, nil }
func (nullStaging) sync(context.Context) error               { return nil }
func (nullStaging) close(context.Context) error              { return nil }

// BenchmarkStagingReadOnly reads a 4 GiB file from the page cache (written
// and read once first) through a staging ring with the GPU left out (no
// copies), laid out in ranges of 32 MiB as in 1 GiB buckets: the speed of
// the ring's parallel reads alone, to compare with stages'
// BenchmarkGPUCheckpoint, with the default readers and with 8 and 16. It
// needs no GPU.
//
//	gpu.test -test.run '^$' -test.bench 'StagingReadOnly' -test.benchtime 3x
func BenchmarkStagingReadOnly(b *testing.B) {
	const total, each, bucket = 4 << 30, 32 << 20, 1 << 30
	path := filepath.Join(b.TempDir(), "staging.bin")
	writeRandom(b, path, total)
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := io.Copy(io.Discard, f); err != nil { // into the page cache
		b.Fatal(err)
	}
	def := DefaultStagingConfig()
	for _, readers := range []int{def.Readers, 8, 16} {
		cfg := def
		cfg.Readers = readers
		b.Run(fmt.Sprintf("readers=%d", readers), func(b *testing.B) {
			r, err := newStagingRing(nullStaging{}, cfg)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			defer func() {
				if err := r.Close(ctx); err != nil {
					b.Error(err)
				}
			}()
			round := func() {
				var fill int64
				for off := int64(0); off < total; off += each {
					if fill+each > bucket {
						if err := r.Drain(ctx); err != nil {
							b.Fatal(err)
						}
						fill = 0
					}
					src := source{name: "file", r: io.NewSectionReader(f, off, each)}
					if err := r.Copy(ctx, src, 1<<50+uint64(fill), each, 0); err != nil {
						b.Fatal(err)
					}
					fill += each
				}
				if err := errors.Join(r.Drain(ctx), r.Stop(ctx)); err != nil {
					b.Fatal(err)
				}
			}
			round() // the slots
			b.SetBytes(total)
			b.ResetTimer()
			for b.Loop() {
				round()
			}
			b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}

// writeRandom writes n random bytes to path.
func writeRandom(b *testing.B, path string, n int) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.NewChaCha8([32]byte{7})
	if _, err := io.CopyN(f, rng, int64(n)); err != nil {
		f.Close()
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}
