package source_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/safetensors/safetensorstest"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
	"github.com/weightcast/weightcast/wire"
)

// dropCache evicts the files from the page cache, for cold reads.
func dropCache(b *testing.B, paths []string) {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		if err := source.FadviseDontNeed(f, 0, 0); err != nil {
			b.Skipf("cannot drop the page cache here: %v", err)
		}
		f.Close()
	}
}

// discardSink counts what it is given.
type discardSink struct{ n int64 }

func (d *discardSink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	d.n += int64(len(data))
	return nil
}

func (d *discardSink) Commit(ctx context.Context, version uint64) error { return nil }

// plainWriter hides io.Discard's ReadFrom, so io.CopyBuffer uses its buffer.
type plainWriter struct{}

func (plainWriter) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkCheckpoint syncs a 1 GiB checkpoint of 8 shards from disk to one
// receiver (inproc transport) and compares it with reading the same files
// sequentially in the same run. The "read" cases come first; every "sync"
// case reports its speed as a fraction of read/1MiB of the same cache state
// ("x-read"). Cold cases evict the files from the page cache before each
// iteration (posix_fadvise DONTNEED), so they measure the disk.
//
//	go test -run '^$' -bench Checkpoint -benchtime 5x ./source
func BenchmarkCheckpoint(b *testing.B) {
	if testing.Short() {
		b.Skip("uses a 1 GiB checkpoint")
	}
	dir := safetensorstest.Bench(b, 1<<30, 8)
	paths, fileBytes := safetensorstest.BenchFiles(b, dir)
	baseline := map[string]float64{} // GB/s of read/1MiB, by cache state
	for _, cache := range []string{"warm", "cold"} {
		prepare := func(b *testing.B) {
			b.StopTimer()
			if cache == "cold" {
				dropCache(b, paths)
			}
			b.StartTimer()
		}
		if cache == "warm" {
			for _, p := range paths { // warm the cache
				f, _ := os.Open(p)
				io.Copy(io.Discard, f)
				f.Close()
			}
		}
		// timed runs pass once per iteration and reports GB/s of n bytes.
		timed := func(b *testing.B, n int64, pass func() error) float64 {
			b.SetBytes(n)
			var wall time.Duration
			for b.Loop() {
				prepare(b)
				t0 := time.Now()
				if err := pass(); err != nil {
					b.Fatal(err)
				}
				wall += time.Since(t0)
			}
			gbs := float64(n) * float64(b.N) / wall.Seconds() / 1e9
			b.ReportMetric(gbs, "GB/s")
			return gbs
		}
		readFiles := func(copyFile func(f *os.File) error) func() error {
			return func() error {
				for _, p := range paths {
					f, err := os.Open(p)
					if err != nil {
						return err
					}
					err = copyFile(f)
					f.Close()
					if err != nil {
						return err
					}
				}
				return nil
			}
		}
		b.Run(cache+"/read/1MiB", func(b *testing.B) {
			buf := make([]byte, 1<<20)
			baseline[cache] = timed(b, fileBytes, readFiles(func(f *os.File) error { _, err := io.CopyBuffer(plainWriter{}, f, buf); return err }))
		})
		b.Run(cache+"/read/io.Copy-Discard", func(b *testing.B) {
			timed(b, fileBytes, readFiles(func(f *os.File) error { _, err := io.Copy(io.Discard, f); return err }))
		})
		// The tensors read as Pack reads them (through the Checkpoint's
		// readers, into a 64 MiB buffer, one read per tensor) with no
		// pipeline: the ceiling of the pack stage.
		b.Run(cache+"/read/tensors-into-64MiB", func(b *testing.B) {
			ckpt, err := source.OpenCheckpoint(dir)
			if err != nil {
				b.Fatal(err)
			}
			defer ckpt.Close()
			buf := make([]byte, 64<<20)
			timed(b, ckpt.Size(), func() error {
				fill := int64(0)
				return ckpt.Tensors(context.Background(), func(t *stages.Tensor) error {
					n, _ := t.Size()
					if fill+n > int64(len(buf)) {
						fill = 0
					}
					err := t.ReadAt(buf[fill:fill+n], 0)
					fill += n
					return err
				})
			})
		})
		type syncCase struct {
			bucket    int
			readAhead int64
			sink      string
			checksum  bool
		}
		cases := []syncCase{
			{64 << 20, 0, "discard", false},
			{64 << 20, 16 << 20, "discard", false},
			{64 << 20, 64 << 20, "discard", false},
			{256 << 20, 0, "discard", false},
			{256 << 20, 64 << 20, "discard", false},
			{64 << 20, 0, "checksum", true},
		}
		for _, c := range cases {
			name := fmt.Sprintf("%s/sync/bucket=%dMiB/readahead=%dMiB/sink=%s/bucketsum=%v", cache, c.bucket>>20, c.readAhead>>20, c.sink, c.checksum)
			b.Run(name, func(b *testing.B) {
				ckpt, err := source.OpenCheckpoint(dir, source.WithReadAhead(c.readAhead))
				if err != nil {
					b.Fatal(err)
				}
				defer ckpt.Close()
				g := stagestest.NewGroup(b, stagestest.GroupOptions{World: 2, Bucket: c.bucket, Checksum: c.checksum})
				ctx := context.Background()
				b.SetBytes(ckpt.Size())
				var wall time.Duration
				busy := map[string]time.Duration{}
				version := uint64(0)
				for b.Loop() {
					prepare(b)
					version++
					var into stages.Sink = &discardSink{}
					if c.sink == "checksum" {
						into = sink.NewChecksums()
					}
					t0 := time.Now()
					var sst, rst stages.RoundStats
					var serr, rerr error
					var wg sync.WaitGroup
					wg.Go(func() { sst, serr = g.Sender.Sync(ctx, ckpt, version) })
					wg.Go(func() { rst, rerr = g.Receivers[0].Sync(ctx, into) })
					wg.Wait()
					if err := errors.Join(serr, rerr); err != nil {
						b.Fatal(err)
					}
					wall += time.Since(t0)
					for _, m := range sst.Stages {
						busy["send "+m.Stage] += m.Busy
					}
					for _, m := range rst.Stages {
						busy["recv "+m.Stage] += m.Busy
					}
				}
				// Each stage's busy time per round, to see which one bounds it.
				for _, st := range []string{"send pack", "send broadcast", "recv broadcast", "recv load"} {
					b.ReportMetric(float64(busy[st].Microseconds())/1e3/float64(b.N), strings.ReplaceAll(st, " ", "-")+"-ms/op")
				}
				gbs := float64(ckpt.Size()) * float64(b.N) / wall.Seconds() / 1e9
				b.ReportMetric(gbs, "GB/s")
				if base := baseline[cache]; base > 0 {
					b.ReportMetric(gbs/base, "x-read")
				}
			})
		}
	}
}
