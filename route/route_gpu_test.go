package route

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/layout"
	"github.com/weightcast/weightcast/transport/ipc"
)

// The tests below need a GPU; they skip, saying why, where CUDA is absent.

// TestRoutedGPU routes device shards from 2 senders to 4 receivers at TP 2
// on one GPU over ipc's pairs (ranks as goroutines), with checksums and,
// in a second run, a group secret (the MAC kernel): every receiver's
// device shard equals its slice of the model, two versions.
func TestRoutedGPU(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	ts := model()
	for _, secret := range []bool{false, true} {
		t.Run(fmt.Sprintf("secret=%v", secret), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var keys func(string) *auth.Keys
			if secret {
				sec, err := auth.NewSecret(bytes.Repeat([]byte{7}, 32))
				if err != nil {
					t.Fatal(err)
				}
				keys = func(group string) *auth.Keys {
					k, err := sec.RunKeys(group, "run-1")
					if err != nil {
						t.Fatal(err)
					}
					return k
				}
			}
			needs := []Need{{TP: 2, TPRank: 0, Model: llama}, {TP: 2, TPRank: 1, Model: llama}, {TP: 2, TPRank: 0, Model: llama}, {TP: 2, TPRank: 1, Model: llama}}
			g := openGroupOn(t, ctx, ipc.Descriptor.OpenPairs, d, keys, 2, 4, 4096, needs, nil)
			dests := make([]*Shards, 4)
			ds := make([]Dest, 4)
			for i := range dests {
				dests[i] = &Shards{Device: d}
				ds[i] = dests[i]
				t.Cleanup(func() { dests[i].Close() })
			}
			for v := uint64(1); v <= 2; v++ {
				shards := make([][]Local, 2)
				for i := range shards {
					for _, l := range fsdp(ts, i, 2, v) {
						b := gputest.Alloc(t, d, max(len(l.Data), 1))
						gputest.Upload(t, s, b, 0, l.Data)
						shards[i] = append(shards[i], Local{Shard: l.Shard, Buffer: b})
					}
				}
				_, errs := g.round(ctx, v, shards, ds)
				for r, err := range errs {
					if err != nil {
						t.Fatalf("version %d rank %d: %v", v, r, err)
					}
				}
				for i, dd := range dests {
					for _, tn := range ts {
						k, _ := layout.DefaultRules().Kind(tn.Name)
						want, ok, _ := k.Need(tn, layout.Coord{TPRank: i % 2, TPSize: 2, EPSize: 1}, llama)
						got, found := dd.Get(tn.Name)
						if !ok {
							continue
						}
						if !found || !got.Slice.Equal(want) {
							t.Fatalf("receiver %d: %s holds %v, want %v", i, tn.Name, got.Slice, want)
						}
						n := int(want.Elements()) * tn.DType.Size()
						if !bytes.Equal(gputest.Download(t, s, got.Buffer, 0, n), Region(tn, want, full(tn, v))) {
							t.Fatalf("version %d receiver %d: %s differs from its slice", v, i, tn.Name)
						}
					}
				}
			}
		})
	}
}
