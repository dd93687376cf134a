package stages

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/safetensors/safetensorstest"
)

// These need a GPU; they skip without one.

// stagingCheckpoint writes a checkpoint of about 90 MiB: tensors larger
// than a staging slot (16 MiB) and than the 32 MiB test bucket, hundreds of
// small ones of odd sizes between them, F32 tensors (for Cast) and 16-bit
// ones.
func stagingCheckpoint(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	var shards [][]safetensorstest.Spec
	for s := range 3 {
		var sh []safetensorstest.Spec
		sh = append(sh, safetensorstest.Spec{Name: fmt.Sprintf("s%d.big", s), DType: dtype.BF16, Shape: []int64{5000, 4100}}) // 39 MiB
		for i := range 150 {
			sh = append(sh, safetensorstest.Spec{Name: fmt.Sprintf("s%d.small.%d", s, i), DType: dtype.F32, Shape: []int64{int64(1 + i*37%700)}})
			if i%50 == 7 {
				sh = append(sh, safetensorstest.Spec{Name: fmt.Sprintf("s%d.mid.%d", s, i), DType: dtype.F16, Shape: []int64{1000, 1537}}) // 2.9 MiB
			}
		}
		sh = append(sh, safetensorstest.Spec{Name: fmt.Sprintf("s%d.empty", s), DType: dtype.F32, Shape: []int64{0, 3}})
		shards = append(shards, sh)
	}
	return safetensorstest.Write(t, dir, 11, shards, true)
}

// TestGPUPackCheckpoint packs a checkpoint from disk into device buckets of
// 32 MiB through the staging ring, with the default ring and with a small
// one that is refilled many times a bucket, as is and cast to BF16, and
// compares every bucket byte for byte after copying it back. The second
// round of each reuses the Packer's pinned slots of the first.
func TestGPUPackCheckpoint(t *testing.T) {
	d := gputest.Device(t)
	dir := t.TempDir()
	data := stagingCheckpoint(t, dir)
	ckpt := openFiles(t, dir)
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
	def := gpu.DefaultStagingConfig()
	for _, c := range []struct {
		name    string
		cfg     gpu.StagingConfig
		castTo  dtype.DType
		perCopy bool
	}{
		{"default", def, dtype.Invalid, false},
		{"small-ring", gpu.StagingConfig{Slots: 3, SlotSize: 1 << 20, Piece: 256 << 10, Readers: 5}, dtype.Invalid, false},
		{"one-slot", gpu.StagingConfig{Slots: 1, SlotSize: 4 << 20, Piece: 64 << 10, Readers: 8}, dtype.Invalid, false},
		{"small-ring-perCopy", gpu.StagingConfig{Slots: 2, SlotSize: 2 << 20, Piece: 512 << 10, Readers: 3}, dtype.Invalid, true},
		{"cast-bf16", def, dtype.BF16, false},
		{"cast-bf16-small-ring", gpu.StagingConfig{Slots: 4, SlotSize: 1 << 20, Piece: 64 << 10, Readers: 6}, dtype.BF16, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan := defaultPlan
			if c.perCopy {
				plan = devicePlan{gatherBelow: defaultPlan.gatherBelow, perCopy: true}
			}
			pk := testPacker(t, plan, c.cfg)
			var src tensorList
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
			pinned := 0
			for round := range 2 {
				n := checkPacked(t, src, exp, pool, pk)
				if pool.Held() != 0 {
					t.Fatalf("round %d: %d buffers still held", round, pool.Held())
				}
				if pk.dev == nil || pk.dev.ring == nil {
					t.Fatalf("round %d: the Packer kept no staging ring", round)
				}
				allocs := pk.dev.ring.Pinned() - pinned
				pinned += allocs
				if round > 0 && allocs != 0 {
					t.Fatalf("round %d pinned %d slots; the previous round's should have been kept", round, allocs)
				}
				if pinned > c.cfg.Slots {
					t.Fatalf("%d slots pinned for a ring of %d", pinned, c.cfg.Slots)
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
	pk := testPacker(t, defaultPlan, gpu.StagingConfig{Slots: 3, SlotSize: 1 << 20, Piece: 128 << 10, Readers: 4})
	var src tensorList
	for i := range 40 {
		data := make([]byte, 300<<10)
		tn := &Tensor{Name: fmt.Sprintf("w%d", i), DType: dtype.U8, Shape: []int64{int64(len(data))}, Data: data}
		if i == 25 {
			tn.Data, tn.Reader, tn.Name = nil, failReader{data: data, at: 200 << 10}, "bad.weight"
		}
		src = append(src, tn)
	}
	pool := devicePool(t, d, DefaultBuffers, 2<<20)
	err := packRound(src, PackConfig{Pool: pool, Version: 1}, pk, waitFence)
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
	paths, _ := safetensorstest.BenchFiles(b, dir)
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

// failReader fails reads that reach byte at.
type failReader struct {
	data []byte
	at   int64
}

var errDiskOnFire = errors.New("disk on fire")

func (f failReader) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > f.at {
		return 0, errDiskOnFire
	}
	return copy(p, f.data[off:]), nil
}
