package source_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/safetensors"
	"github.com/weightcast/weightcast/safetensors/safetensorstest"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
	"github.com/weightcast/weightcast/wire"
)

func TestCheckpointRoundTrip(t *testing.T) {
	for _, layout := range []string{"single", "sharded"} {
		src := t.TempDir()
		shards := safetensorstest.Shards()
		if layout == "single" {
			shards = [][]safetensorstest.Spec{slices.Concat(shards...)}
		}
		safetensorstest.Write(t, src, 1, shards, layout == "sharded")
		ckpt, err := source.OpenCheckpoint(src)
		if err != nil {
			t.Fatal(err)
		}
		defer ckpt.Close()
		for _, bucket := range []int{4 << 10, 64 << 10, 1 << 20} {
			t.Run(fmt.Sprintf("%s/bucket=%d", layout, bucket), func(t *testing.T) {
				outs := safetensorstest.OutDirs(t, 3)
				stagestest.WriteRounds(t, ckpt, bucket, outs, 2)
				for _, o := range outs {
					safetensorstest.SameFiles(t, src, o)
				}
			})
		}
	}
}

// TestCheckpointReference syncs the checkpoints written by the Python
// safetensors package and transformers and expects them back byte for byte.
func TestCheckpointReference(t *testing.T) {
	ref := filepath.Join("..", "safetensors", "testdata", "reference")
	cases := []string{"mixed.safetensors", "numpy_nometa.safetensors", "empty.safetensors", "sharded_transformers"}
	for _, c := range cases {
		t.Run(c, func(t *testing.T) {
			path := filepath.Join(ref, c)
			ckpt, err := source.OpenCheckpoint(path)
			if err != nil {
				t.Fatal(err)
			}
			defer ckpt.Close()
			outs := safetensorstest.OutDirs(t, 3)
			stagestest.WriteRounds(t, ckpt, 1<<10, outs, 1)
			want := path
			if !strings.HasSuffix(c, ".safetensors") {
				for _, o := range outs {
					safetensorstest.SameFiles(t, want, o)
				}
				return
			}
			a, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range outs {
				if n := safetensorstest.DirFiles(t, o); !slices.Equal(n, []string{c}) {
					t.Fatalf("%s holds %q, want only %s", o, n, c)
				}
				b, err := os.ReadFile(filepath.Join(o, c))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(a, b) {
					t.Fatalf("%s differs from the reference file", filepath.Join(o, c))
				}
			}
		})
	}
}

func TestCheckpointSourceInfo(t *testing.T) {
	src := t.TempDir()
	data := safetensorstest.Write(t, src, 2, safetensorstest.Shards(), true)
	ckpt, err := source.OpenCheckpoint(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	info := ckpt.SourceInfo()
	if info.Format != "safetensors" || !slices.Equal(info.MetadataKeys, safetensorstest.MetaKeys) || info.Metadata["author"] != safetensorstest.Meta["author"] {
		t.Fatalf("info %+v", info)
	}
	if len(info.Shards) != 3 || info.Shards[1].File != "model-00002-of-00003.safetensors" || info.Shards[1].Tensors[2] != "model.layers.0.mlp.gate.weight" || info.Shards[1].Metadata != nil {
		t.Fatalf("shards %+v", info.Shards)
	}
	var im map[string]any
	if err := json.Unmarshal(info.IndexMetadata, &im); err != nil || im["note"] != "sharded for tests" {
		t.Fatalf("index metadata %s: %v", info.IndexMetadata, err)
	}
	// The emitted order is shard order, then file offset; every byte reads back.
	var names []string
	var size int64
	err = ckpt.Tensors(context.Background(), func(tn *stages.Tensor) error {
		names = append(names, tn.Name)
		n, err := tn.Size()
		if err != nil {
			return err
		}
		b := make([]byte, n)
		if err := tn.ReadAt(b, 0); err != nil {
			return err
		}
		if !bytes.Equal(b, data[tn.Name]) {
			return fmt.Errorf("tensor %s differs", tn.Name)
		}
		size += n
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, sh := range info.Shards {
		want = append(want, sh.Tensors...)
	}
	if !slices.Equal(names, want) || size != ckpt.Size() || ckpt.Len() != len(want) {
		t.Fatalf("emitted %q (%d bytes), want %q (%d bytes)", names, size, want, ckpt.Size())
	}
	// Reads outside a tensor fail, naming it.
	tn, _ := ckpt.Lookup("model.norm.weight")
	if err := tn.ReadAt(make([]byte, 8), 36); err == nil || !strings.Contains(err.Error(), "model.norm.weight") {
		t.Fatalf("read past the end: %v", err)
	}
}

func TestCheckpointOpenErrors(t *testing.T) {
	dir := t.TempDir()
	safetensorstest.Write(t, dir, 3, safetensorstest.Shards(), true)
	// A shard that does not match the index: errors from package
	// safetensors pass through, naming file and tensor.
	p := filepath.Join(dir, "model-00003-of-00003.safetensors")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b[:len(b)-10], 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = source.OpenCheckpoint(dir)
	var se *safetensors.Error
	if !errors.As(err, &se) || !errors.Is(err, safetensors.ErrTruncated) || se.File != p || se.Tensor != "lm_head.weight" {
		t.Fatalf("truncated shard: %v", err)
	}
	if _, err := source.OpenCheckpoint(filepath.Join(dir, "nothing")); err == nil {
		t.Fatal("opened a missing path")
	}
}

// hookSource calls before(name) just before emitting each tensor.
type hookSource struct {
	stages.Source
	before func(name string)
}

func (h hookSource) Tensors(ctx context.Context, emit func(*stages.Tensor) error) error {
	return h.Source.Tensors(ctx, func(t *stages.Tensor) error {
		h.before(t.Name)
		return emit(t)
	})
}

func (h hookSource) SourceInfo() *wire.SourceInfo { return h.Source.(stages.Describer).SourceInfo() }

// TestCheckpointChangedUnderRound truncates or rewrites a shard before or
// during a round: the round fails on every rank, the sender's error names
// the file and wraps ErrChanged, nothing hangs, and the receivers'
// directories keep the previous round.
func TestCheckpointChangedUnderRound(t *testing.T) {
	cases := []struct {
		name   string
		during bool
		change func(path string) error
	}{
		{"truncated before the round", false, func(p string) error { return os.Truncate(p, 1000) }},
		{"truncated during the round", true, func(p string) error { return os.Truncate(p, 1000) }},
		{"rewritten in place during the round", true, func(p string) error {
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := f.WriteAt([]byte("changed!"), 2000); err != nil {
				return err
			}
			return os.Chtimes(p, time.Now(), time.Now().Add(time.Hour))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := t.TempDir()
			safetensorstest.Write(t, src, 4, safetensorstest.Shards(), true)
			ckpt, err := source.OpenCheckpoint(src)
			if err != nil {
				t.Fatal(err)
			}
			defer ckpt.Close()
			outs := safetensorstest.OutDirs(t, 3)
			g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 4, Bucket: 4 << 10, Checksum: true})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var sinks []stages.Sink
			for _, o := range outs {
				sinks = append(sinks, sink.WriteSafetensors(o, sink.SafetensorsWithoutSync()))
			}
			if err := g.Round(ctx, ckpt, 1, sinks); err != nil {
				t.Fatal(err)
			}
			victim := filepath.Join(src, "model-00002-of-00003.safetensors")
			var src2 stages.Source = ckpt
			if c.during {
				var once sync.Once
				src2 = hookSource{Source: ckpt, before: func(name string) {
					if name == "model.layers.0.self_attn.q_proj.weight" {
						once.Do(func() {
							if err := c.change(victim); err != nil {
								t.Error(err)
							}
						})
					}
				}}
			} else if err := c.change(victim); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			errs := g.RoundClosingOnError(ctx, src2, 2, sinks)
			if time.Since(start) > 10*time.Second {
				t.Fatalf("the failed round took %v", time.Since(start))
			}
			if !errors.Is(errs[0], source.ErrChanged) || !strings.Contains(errs[0].Error(), victim) {
				t.Fatalf("sender: %v", errs[0])
			}
			t.Logf("sender: %v\nreceiver 1: %v", errs[0], errs[1])
			for i, err := range errs[1:] {
				if err == nil {
					t.Fatalf("receiver %d succeeded in a round whose source failed", i+1)
				}
			}
			// The first round's files are still there, whole, with
			// nothing of the failed round beside them (the receivers
			// aborted their sinks), and each receiver says so.
			ref := t.TempDir()
			safetensorstest.Write(t, ref, 4, safetensorstest.Shards(), true)
			for i, o := range outs {
				safetensorstest.SameFiles(t, ref, o)
				if st := g.Receivers[i].State(); st != stages.StateIntact {
					t.Errorf("receiver %d: state %v after a failed round that left its files as they were, want intact", i+1, st)
				}
			}
		})
	}
}

func TestCheckpointReadAhead(t *testing.T) {
	src := t.TempDir()
	data := safetensorstest.Write(t, src, 5, safetensorstest.Shards(), true)
	for _, window := range []int64{0, 4 << 10, 1 << 20} {
		ckpt, err := source.OpenCheckpoint(src, source.WithReadAhead(window))
		if err != nil {
			t.Fatal(err)
		}
		on, _, _ := source.ReadAheadOf(ckpt)
		if on != (window > 0 && source.FadviseSupported) {
			t.Fatalf("window %d: read-ahead %v", window, on)
		}
		reads := 0
		for round := 0; round < 2; round++ {
			err = ckpt.Tensors(context.Background(), func(tn *stages.Tensor) error {
				n, _ := tn.Size()
				b := make([]byte, n)
				for off := int64(0); off < n; off += 1000 {
					k := min(1000, n-off)
					if err := tn.ReadAt(b[off:off+k], off); err != nil {
						return err
					}
					reads++
				}
				if !bytes.Equal(b, data[tn.Name]) {
					return fmt.Errorf("tensor %s differs", tn.Name)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if on, requests, advised := source.ReadAheadOf(ckpt); on {
			// One request per half window, not one per read; two rounds.
			most := 2 * (ckpt.Size()/(window/2) + 2)
			if requests == 0 || requests > most || advised > ckpt.Size() {
				t.Fatalf("window %d: %d advice requests for %d reads (at most %d expected), advised up to %d of %d",
					window, requests, reads, most, advised, ckpt.Size())
			}
		}
		ckpt.Close()
	}
}

// TestCheckpointDescriptionLimit: a checkpoint whose description could
// not travel in a round's first bucket is refused at open, naming the
// checkpoint and both sizes; one that fits is not.
func TestCheckpointDescriptionLimit(t *testing.T) {
	info := &wire.SourceInfo{Format: "safetensors", Metadata: map[string]string{"notes": strings.Repeat("a", source.MaxDescription)}}
	err := source.CheckDescription("/models/m", info)
	if !errors.Is(err, safetensors.ErrLimit) || !strings.Contains(err.Error(), "/models/m") ||
		!strings.Contains(err.Error(), fmt.Sprintf("more than the %d bytes", source.MaxDescription)) {
		t.Fatalf("want ErrLimit naming the checkpoint and the limit, got %.400v", err)
	}
	info.Metadata["notes"] = strings.Repeat("a", source.MaxDescription-100)
	if err := source.CheckDescription("/models/m", info); err != nil {
		t.Fatalf("a description under the limit: %.300v", err)
	}
}
