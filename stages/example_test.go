package stages_test

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/transport/inproc"
	"github.com/weightcast/weightcast/wire"
)

// Example syncs a small synthetic model from a sender to two receivers in
// one process, over the in-process transport.
func Example() {
	ctx := context.Background()
	model, _ := source.Synthetic{Size: 4 << 20, Tensors: 22, Seed: 1}.Model()

	const world = 3
	var wg sync.WaitGroup
	for rank := range world {
		wg.Go(func() {
			cfg := transport.Config{Group: "example", Rank: rank, WorldSize: world, Device: mem.Host{}}
			ep, _ := transport.Open(ctx, inproc.Name, cfg)
			defer ep.Close()
			pool, _ := stages.NewPool(mem.Host{}, stages.DefaultBuffers, 1<<20)
			defer pool.Close()
			if rank == 0 {
				pub, _ := inproc.OpenPublisher(ctx, cfg)
				defer pub.Close()
				sender := stages.NewSender(stages.SenderConfig{Endpoint: ep, Publisher: pub, Pool: pool, Checksum: true})
				defer sender.Close() // its GPU state; the pool stays ours to close
				st, err := sender.Sync(ctx, model, 1)
				fmt.Printf("sent %d tensors in %d buckets, err=%v\n", st.Tensors, st.Buckets, err)
				return
			}
			sub, _ := inproc.OpenSubscriber(ctx, cfg)
			defer sub.Close()
			receiver := stages.NewReceiver(stages.ReceiverConfig{Endpoint: ep, Subscriber: sub, Pool: pool})
			defer receiver.Close()
			if _, err := receiver.Sync(ctx, sink.Verify(model)); err != nil {
				fmt.Println("rank", rank, "failed:", err)
			}
		})
	}
	wg.Wait()
	// Output: sent 22 tensors in 4 buckets, err=<nil>
}

// Example_customPipeline composes a sender's pipeline by hand and inserts a
// stage between iterate and pack that skips frozen tensors (here, the
// embeddings), so they are never packed or sent.
func Example_customPipeline() {
	ctx := context.Background()
	model, _ := source.Synthetic{Size: 1 << 20, Tensors: 13, Seed: 1}.Model()
	const world = 2
	var wg sync.WaitGroup
	for rank := range world {
		wg.Go(func() {
			cfg := transport.Config{Group: "example-custom", Rank: rank, WorldSize: world, Device: mem.Host{}}
			ep, _ := transport.Open(ctx, inproc.Name, cfg)
			defer ep.Close()
			pool, _ := stages.NewPool(mem.Host{}, stages.DefaultBuffers, 256<<10)
			defer pool.Close()
			if rank == 1 {
				sub, _ := inproc.OpenSubscriber(ctx, cfg)
				defer sub.Close()
				var names []string
				into := sink.Callback(func(ctx context.Context, t sink.Received) error {
					names = append(names, t.Name)
					return nil
				}, nil)
				receiver := stages.NewReceiver(stages.ReceiverConfig{Endpoint: ep, Subscriber: sub, Pool: pool})
				defer receiver.Close()
				if _, err := receiver.Sync(ctx, into); err != nil {
					fmt.Println("rank", rank, "failed:", err)
				}
				fmt.Println("received", len(names), "tensors; embeddings among them:", strings.Contains(strings.Join(names, " "), "embed_tokens"), "; committed version", receiver.Committed())
				return
			}
			pub, _ := inproc.OpenPublisher(ctx, cfg)
			defer pub.Close()

			// iterate ──► skip-frozen ──► pack ──► publish ──► broadcast
			p := pipeline.New("custom sender")
			tensors := stages.Iterate(p, model)
			trainable := pipeline.Filter(p, "skip-frozen", tensors, 8, func(t *stages.Tensor) bool {
				return !strings.Contains(t.Name, "embed_tokens")
			})
			buckets := stages.Pack(p, trainable, stages.PackConfig{Pool: pool, Version: 1, Checksum: true})
			var next uint64 // the sequence number after the last bucket
			stages.Broadcast(p, stages.Publish(p, buckets, pub), ep, func(m *wire.BucketMeta) { next = m.Seq + 1 })
			err := p.Run(ctx)
			if err == nil {
				err = pub.Sync(ctx) // every receiver has every bucket
			}
			if err == nil {
				err = stages.AnnounceCommit(ctx, pub, next, 1, nil) // so version 1 is the group's
			}
			if err != nil {
				fmt.Println("sync failed:", err)
			}
			fmt.Print(p.Graph().Mermaid())
		})
	}
	wg.Wait()
	// Unordered output:
	// received 12 tensors; embeddings among them: false ; committed version 1
	// flowchart LR
	//     %% custom sender
	//     iterate([iterate])
	//     skip_frozen[skip-frozen]
	//     pack[pack]
	//     publish[publish]
	//     broadcast[/broadcast/]
	//     iterate -- "stages.Tensor, cap 64" --> skip_frozen
	//     skip_frozen -- "stages.Tensor, cap 8" --> pack
	//     pack -- "stages.Bucket, cap 1" --> publish
	//     publish -- "stages.Bucket, cap 1" --> broadcast
}
