package stages_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/safetensors"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/inproc"
)

// Example_checkpoint syncs a safetensors checkpoint from disk to a receiver
// in the rollout dtype: the F32 weights travel and land as BF16, the
// integer tensor as it is, and the receiver writes a checkpoint with the
// source's file name and metadata.
func Example_checkpoint() {
	ctx := context.Background()
	tmp, _ := os.MkdirTemp("", "weightcast-example-")
	defer os.RemoveAll(tmp)

	// A small trainer checkpoint: two F32 weights and an I64 tensor.
	src := filepath.Join(tmp, "trainer", "model.safetensors")
	os.MkdirAll(filepath.Dir(src), 0o755)
	w, _ := safetensors.Create(src, []safetensors.TensorInfo{
		{Name: "model.embed.weight", DType: dtype.F32, Shape: []int64{4, 2}},
		{Name: "model.norm.weight", DType: dtype.F32, Shape: []int64{2}},
		{Name: "model.position_ids", DType: dtype.I64, Shape: []int64{3}},
	}, map[string]string{"format": "pt"})
	for _, t := range w.Tensors() {
		b := make([]byte, t.Size)
		for i := 0; i+4 <= len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(1.5+float32(i)))
		}
		w.WriteTensorAt(t.Name, b, 0)
	}
	w.Close()

	ckpt, err := source.OpenCheckpoint(src)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ckpt.Close()
	rollout := stages.Cast(ckpt, dtype.BF16) // verl's rollout_dtype

	out := filepath.Join(tmp, "rollout")
	const world = 2
	var wg sync.WaitGroup
	for rank := range world {
		wg.Go(func() {
			cfg := transport.Config{Group: "example-checkpoint", Rank: rank, WorldSize: world, Device: mem.Host{}}
			ep, _ := transport.Open(ctx, inproc.Name, cfg)
			defer ep.Close()
			pool, _ := stages.NewPool(mem.Host{}, stages.DefaultBuffers, 64<<10)
			defer pool.Close()
			if rank == 0 {
				pub, _ := inproc.OpenPublisher(ctx, cfg)
				defer pub.Close()
				sender := stages.NewSender(stages.SenderConfig{Endpoint: ep, Publisher: pub, Pool: pool, Checksum: true})
				defer sender.Close() // its GPU state; the pool stays ours to close
				if _, err := sender.Sync(ctx, rollout, 1); err != nil {
					fmt.Println("send failed:", err)
				}
				return
			}
			sub, _ := inproc.OpenSubscriber(ctx, cfg)
			defer sub.Close()
			receiver := stages.NewReceiver(stages.ReceiverConfig{Endpoint: ep, Subscriber: sub, Pool: pool, Rank: rank})
			defer receiver.Close()
			if _, err := receiver.Sync(ctx, sink.WriteSafetensors(out)); err != nil {
				fmt.Println("receive failed:", err)
			}
		})
	}
	wg.Wait()

	f, err := safetensors.Open(filepath.Join(out, "model.safetensors"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()
	fmt.Println("metadata:", f.Metadata())
	for _, t := range f.Tensors() {
		fmt.Println(t.Name, t.DType, t.Shape)
	}
	// Output:
	// metadata: map[format:pt]
	// model.embed.weight BF16 [4 2]
	// model.norm.weight BF16 [2]
	// model.position_ids I64 [3]
}
