package stages

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
)

// These need a GPU; they skip without one.

// withStaging makes Pack stage host tensors with cfg until the test ends.
func withStaging(tb testing.TB, cfg stagingConfig) {
	old := stagingDefaults
	stagingDefaults = func() stagingConfig { return cfg }
	tb.Cleanup(func() { stagingDefaults = old })
}

// stagingCheckpoint writes a checkpoint of about 90 MiB: tensors larger
// than a staging slot (16 MiB) and than the 32 MiB test bucket, hundreds of
// small ones of odd sizes between them, F32 tensors (for Cast) and 16-bit
// ones.
func stagingCheckpoint(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	var shards [][]spec
	for s := range 3 {
		var sh []spec
		sh = append(sh, spec{fmt.Sprintf("s%d.big", s), dtype.BF16, []int64{5000, 4100}}) // 39 MiB
		for i := range 150 {
			sh = append(sh, spec{fmt.Sprintf("s%d.small.%d", s, i), dtype.F32, []int64{int64(1 + i*37%700)}})
			if i%50 == 7 {
				sh = append(sh, spec{fmt.Sprintf("s%d.mid.%d", s, i), dtype.F16, []int64{1000, 1537}}) // 2.9 MiB
			}
		}
		sh = append(sh, spec{fmt.Sprintf("s%d.empty", s), dtype.F32, []int64{0, 3}})
		shards = append(shards, sh)
	}
	return makeShards(t, dir, 11, shards, true)
}

// TestGPUPackCheckpoint packs a checkpoint from disk into device buckets of
// 32 MiB through the staging ring, with the default ring and with a small
// one that is refilled many times a bucket, as is and cast to BF16, and
// compares every bucket byte for byte after copying it back. The second
// round of each reuses the pinned slots of the first.
func TestGPUPackCheckpoint(t *testing.T) {
	d := gputest.Device(t)
	dir := t.TempDir()
	data := stagingCheckpoint(t, dir)
	ckpt, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	cast := map[string][]byte{}
	for name, b := range data {
		tn, _ := ckpt.Lookup(name)
		switch tn.DType {
		case dtype.F32, dtype.F16:
			cast[name] = convert16(t, b, tn.DType, dtype.BF16)
		default:
			cast[name] = b
		}
	}
	for _, c := range []struct {
		name    string
		cfg     stagingConfig
		castTo  dtype.DType
		perCopy bool
	}{
		{"default", stagingDefaults(), dtype.Invalid, false},
		{"small-ring", stagingConfig{slots: 3, slotSize: 1 << 20, piece: 256 << 10, readers: 5}, dtype.Invalid, false},
		{"one-slot", stagingConfig{slots: 1, slotSize: 4 << 20, piece: 64 << 10, readers: 8}, dtype.Invalid, false},
		{"small-ring-perCopy", stagingConfig{slots: 2, slotSize: 2 << 20, piece: 512 << 10, readers: 3}, dtype.Invalid, true},
		{"cast-bf16", stagingDefaults(), dtype.BF16, false},
		{"cast-bf16-small-ring", stagingConfig{slots: 4, slotSize: 1 << 20, piece: 64 << 10, readers: 6}, dtype.BF16, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			withStaging(t, c.cfg)
			if c.perCopy {
				withPlan(t, devicePlan{gatherBelow: defaultPlan.gatherBelow, perCopy: true})
			}
			var src Tensors
			if err := Cast(ckpt, c.castTo).Tensors(context.Background(), func(tn *Tensor) error {
				src = append(src, tn)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			exp := data
			if c.castTo != dtype.Invalid {
				exp = cast
			}
			pool := devicePool(t, d, DefaultBuffers, 32<<20)
			for round := range 2 {
				pinned := stagingPinned.Load()
				n := checkPacked(t, src, exp, pool)
				if pool.Held() != 0 {
					t.Fatalf("round %d: %d buffers still held", round, pool.Held())
				}
				allocs := stagingPinned.Load() - pinned
				if round > 0 && c.cfg.slots <= StagingBuffers && allocs != 0 {
					t.Fatalf("round %d allocated %d pinned slots; the previous round's should have been kept", round, allocs)
				}
				t.Logf("round %d: %d tensors in %d buckets, byte-identical; %d pinned slots allocated", round, len(src), n, allocs)
			}
		})
	}
}

// TestGPUPackHostReadError: a read that fails in the middle of a round
// fails it with the tensor named, gives every buffer back, and stops the
// readers (goleak checks at the end of the package's tests).
func TestGPUPackHostReadError(t *testing.T) {
	d := gputest.Device(t)
	withStaging(t, stagingConfig{slots: 3, slotSize: 1 << 20, piece: 128 << 10, readers: 4})
	var src Tensors
	for i := range 40 {
		data := make([]byte, 300<<10)
		tn := &Tensor{Name: fmt.Sprintf("w%d", i), DType: dtype.U8, Shape: []int64{int64(len(data))}, Data: data}
		if i == 25 {
			tn.Data, tn.Reader, tn.Name = nil, failReader{data: data, at: 200 << 10}, "bad.weight"
		}
		src = append(src, tn)
	}
	pool := devicePool(t, d, DefaultBuffers, 2<<20)
	err := packRound(src, PackConfig{Pool: pool, Version: 1}, waitFence)
	if !errors.Is(err, errDiskOnFire) || !strings.Contains(err.Error(), `"bad.weight"`) {
		t.Fatalf("round with a failing read: %v; want the read error naming bad.weight", err)
	}
	if pool.Held() != 0 {
		t.Fatalf("%d buffers still held after the failed round", pool.Held())
	}
}

// warmFiles reads the checkpoint in dir once, so that it is in the page
// cache.
func warmFiles(b *testing.B, dir string) {
	paths, _ := benchFiles(b, dir)
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
}

func gpuAllocNoCleanup(b *testing.B, d *gpu.CUDADevice, n int) mem.Buffer {
	buf, err := d.AllocPinned(n)
	if err != nil {
		b.Fatal(err)
	}
	return buf
}

// nullStaging is a stagingGPU that copies nothing: slots in Go memory,
// kept in spare from round to round, copies dropped, events complete at
// once.
type nullStaging struct{ spare *[][]byte }

type doneEvent struct{}

func (doneEvent) Query() (bool, error) { return true, nil }
func (doneEvent) Close() error         { return nil }

func (g nullStaging) alloc(n int) ([]byte, uint64, func() error, error) {
	var b []byte
	if k := len(*g.spare) - 1; k >= 0 && len((*g.spare)[k]) == n {
		b, *g.spare = (*g.spare)[k], (*g.spare)[:k]
	} else {
		b = make([]byte, n)
	}
	return b, 1 << 40, func() error { *g.spare = append(*g.spare, b); return nil }, nil
}
func (nullStaging) queue([]stageCopy) error       { return nil }
func (nullStaging) record() (stagingEvent, error) { return doneEvent{}, nil }

// stageOnly runs src's tensors through a staging ring with no GPU behind
// it, laid out as in buckets of bsize bytes: the reads alone.
func stageOnly(b *testing.B, src Source, cfg stagingConfig, bsize int64, spare *[][]byte) {
	s, err := newStager(nullStaging{spare}, cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var fill int64
	err = src.Tensors(ctx, func(t *Tensor) error {
		size, err := t.Size()
		if err != nil {
			return err
		}
		for chunk := int64(0); chunk < size; {
			off := alignUp(fill)
			n := min(size-chunk, bsize-off)
			if n < size-chunk {
				n &^= Align - 1
			}
			if n <= 0 || (chunk == 0 && size <= bsize && off+size > bsize) {
				if err := s.drain(ctx); err != nil {
					return err
				}
				fill = 0
				continue
			}
			if err := s.stage(ctx, t, 1<<50+uint64(off), n, chunk); err != nil {
				return err
			}
			fill, chunk = off+n, chunk+n
		}
		return nil
	})
	if err == nil {
		err = s.drain(ctx)
	}
	err = errors.Join(err, s.stop(ctx), s.free())
	if err != nil {
		b.Fatal(err)
	}
}
