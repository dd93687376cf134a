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
	return pipeline.Stage(p, "publish", in, 1, func(ctx context.Context, in *pipeline.Input[*Bucket], out *pipeline.Output[*Bucket]) error {
		for b := range in.All() {
			if err := publish(ctx, b, pub); err != nil {
				b.Release()
				return err
			}
			if err := out.Send(b); err != nil {
				return err
			}
		}
		return in.Err()
	})
}

// publish completes b's checksum and MAC, if pending, and publishes its
// metadata.
func publish(ctx context.Context, b *Bucket, pub transport.Publisher) error {
	m := &b.Meta
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", m.Seq), map[string]any{"bucket": m.Seq, "round": m.Version})
	defer span.End()
	if b.sum != nil {
		v, err := b.sum.Wait(ctx)
		if err != nil {
			return fmt.Errorf("checksum of bucket %d (version %d): %w", m.Seq, m.Version, err)
		}
		m.Checksum = v
	}
	if err := awaitMAC(ctx, b); err != nil {
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
