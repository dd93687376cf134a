package stages

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// Publish adds the stage that sends each bucket's metadata through pub
// before passing the bucket on to have its bytes moved. For a device
// bucket whose checksum or MAC Pack left pending on the GPU, it first
// waits for them (and so for the bucket's copies). The metadata of a
// bucket packed with PackConfig.Auth goes out signed (see mac.go).
func Publish(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], pub transport.Publisher) *pipeline.Stream[*Bucket] {
	return publishStage(p, in, pub, false)
}

// publishStage adds Publish's stage. With sumsFirst, it holds each run of
// direct buckets whose checksums or MACs are pending until the run ends
// (at the round's last bucket or one that is not direct), and publishes
// them once the GPU has computed them all: see Sender's sumsFirst.
func publishStage(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], pub transport.Publisher, sumsFirst bool) *pipeline.Stream[*Bucket] {
	return pipeline.Stage(p, "publish", in, 1, func(ctx context.Context, in *pipeline.Input[*Bucket], out *pipeline.Output[*Bucket]) error {
		var held []*Bucket // direct buckets waiting for the run's last checksum
		defer func() {
			for _, b := range held {
				b.Release()
			}
		}()
		send := func(b *Bucket) error {
			if err := publish(ctx, b, pub); err != nil {
				b.Release()
				return err
			}
			return out.Send(b) // on failure Send releases b
		}
		for b := range in.All() {
			pending := b.Meta.Direct != nil && (b.sum != nil || b.mac != nil)
			if sumsFirst && pending && !b.Meta.IsLast {
				held = append(held, b)
				continue
			}
			if len(held) > 0 {
				// The run's last sum or MAC: the GPU computes them in
				// order, so every held bucket's is in once it is.
				last := held[len(held)-1]
				if pending {
					last = b
				}
				if err := awaitGPU(ctx, last); err != nil {
					b.Release()
					return err
				}
				for len(held) > 0 {
					h := held[0]
					held = held[1:]
					if err := send(h); err != nil {
						b.Release()
						return err
					}
				}
			}
			if err := send(b); err != nil {
				return err
			}
		}
		return in.Err()
	})
}

// awaitGPU completes b's checksum and MAC, if pending on the GPU.
func awaitGPU(ctx context.Context, b *Bucket) error {
	m := &b.Meta
	if b.sum != nil {
		v, err := b.sum.Wait(ctx)
		if err != nil {
			return fmt.Errorf("checksum of bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
		m.Checksum = v
	}
	return awaitMAC(ctx, b)
}

// publish completes b's checksum and MAC, if pending, and publishes its
// metadata.
func publish(ctx context.Context, b *Bucket, pub transport.Publisher) error {
	m := &b.Meta
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", m.Seq), map[string]any{"bucket": m.Seq, "round": m.Version})
	defer span.End()
	if err := awaitGPU(ctx, b); err != nil {
		return err
	}
	msg, err := wire.EncodeMeta(m)
	if err != nil {
		return err
	}
	msg = wire.Seal(b.auth, m.Seq, msg)
	span.Args(map[string]any{"meta_bytes": len(msg)})
	return pub.Publish(ctx, m.Seq, msg)
}
