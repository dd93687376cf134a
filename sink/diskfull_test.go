package sink_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/weightcast/weightcast/internal/faultfs"
	"github.com/weightcast/weightcast/safetensors/safetensorstest"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
	"github.com/weightcast/weightcast/wire"
)

// undescribed is a checkpoint whose description lists its files and
// tensors but not their dtypes and shapes (as older senders sent it), so
// that a Safetensors sink spools all but each file's last tensor.
type undescribed struct{ *source.Checkpoint }

func (u undescribed) SourceInfo() *wire.SourceInfo {
	info := *u.Checkpoint.SourceInfo()
	info.Shards = append([]wire.ShardInfo(nil), info.Shards...)
	for i := range info.Shards {
		info.Shards[i].DTypes, info.Shards[i].Shapes = nil, nil
	}
	return &info
}

// TestSafetensorsSinkDiskFull fills the disk of one receiver's --out
// directory (a faultfs.Disk: space for the committed round and part of the
// next) at many points of the next round: the round fails on every rank
// naming ENOSPC, every receiver's directory holds the committed round's
// files exactly, nothing else takes space on the full disk, every receiver
// reports its model intact, and once there is room the next round works.
func TestSafetensorsSinkDiskFull(t *testing.T) {
	src := t.TempDir()
	safetensorstest.Write(t, src, 9, safetensorstest.Shards(), true)
	ckpt, err := source.OpenCheckpoint(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	var size int64 // the bytes of one round's files
	for _, f := range safetensorstest.DirFiles(t, src) {
		st, err := os.Stat(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		size += st.Size()
	}
	for _, c := range []struct {
		name string
		src  stages.Source
	}{{"announced", ckpt}, {"spooled", undescribed{ckpt}}} {
		for _, room := range []int64{1, size / 7, size / 3, size / 2, size - 4096, size - 100} {
			t.Run(fmt.Sprintf("%s/room %d of %d", c.name, room, size), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				outs := safetensorstest.OutDirs(t, 2)
				disk := faultfs.New(3 * size)
				g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 3, Bucket: 64 << 10, Checksum: true})
				sinks := []stages.Sink{sink.WriteSafetensors(outs[0], sink.SafetensorsWithFS(disk)), sink.WriteSafetensors(outs[1], sink.SafetensorsWithoutSync())}
				if err := g.Round(ctx, c.src, 1, sinks); err != nil {
					t.Fatal(err)
				}
				if disk.Used() != size {
					t.Fatalf("the committed round takes %d bytes of the disk, its files are %d", disk.Used(), size)
				}
				disk.SetCapacity(size + room)
				errs := g.RoundClosingOnError(ctx, c.src, 2, sinks)
				if !errors.Is(errs[1], syscall.ENOSPC) || !strings.Contains(errs[1].Error(), outs[0]) {
					t.Fatalf("receiver 1: want ENOSPC naming a file under %s, got %v", outs[0], errs[1])
				}
				for r, err := range errs {
					if err == nil {
						t.Fatalf("rank %d succeeded in a round that failed on rank 1", r)
					}
				}
				for i, o := range outs {
					safetensorstest.SameFiles(t, src, o) // fails on a leftover round directory
					if st := g.Receivers[i].State(); st != stages.StateIntact {
						t.Errorf("receiver %d: state %v, want intact", i+1, st)
					}
				}
				if disk.Used() != size {
					t.Fatalf("after the failed round the disk holds %d bytes, the committed files %d: temporary files were left", disk.Used(), size)
				}

				// The next run, with room for a round (spooled, a file's
				// bytes are on the disk twice for a while).
				disk.SetCapacity(3 * size)
				g = stagestest.NewGroup(t, stagestest.GroupOptions{World: 3, Bucket: 64 << 10, Checksum: true})
				sinks[0] = sink.WriteSafetensors(outs[0], sink.SafetensorsWithFS(disk))
				if err := g.Round(ctx, c.src, 3, sinks); err != nil {
					t.Fatal(err)
				}
				safetensorstest.SameFiles(t, src, outs[0])
			})
		}
	}
}
