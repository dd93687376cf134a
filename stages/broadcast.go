package stages

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
)

// The broadcast stage moves each bucket's filled bytes from the root to
// every receiver through a transport.Endpoint, which every rank calls for
// the same buckets in the same order, as NCCL's broadcast is called: on
// the root it is the last stage (Broadcast), on a receiver the stage after
// subscribe (Receive). Both wait until the transport is done with the
// bucket, so their spans time the transfer itself.

// Broadcast adds the root's last stage: it moves each bucket's filled bytes
// to every receiver through ep, then releases the bucket and, when done is
// not nil, calls it with the bucket's metadata (for progress reports).
func Broadcast(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], ep transport.Endpoint, done func(*BucketMeta)) {
	pipeline.Sink(p, "broadcast", in, func(ctx context.Context, in *pipeline.Input[*Bucket]) error {
		for b := range in.All() {
			err := move(ctx, b, ep)
			meta := b.Meta
			b.Release()
			if err != nil {
				return err
			}
			pipeline.CountBytes(ctx, meta.Length)
			if done != nil {
				done(&meta)
			}
		}
		return in.Err()
	})
}

// Receive adds a receiver's transport stage, "receive": each bucket's bytes
// land in its buffer through ep before the bucket is passed on.
func Receive(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], ep transport.Endpoint) *pipeline.Stream[*Bucket] {
	return pipeline.Stage(p, "receive", in, 1, func(ctx context.Context, in *pipeline.Input[*Bucket], out *pipeline.Output[*Bucket]) error {
		for b := range in.All() {
			if err := move(ctx, b, ep); err != nil {
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

// move is one rank's part of the broadcast of b.
func move(ctx context.Context, b *Bucket, ep transport.Endpoint) error {
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", b.Meta.Seq), map[string]any{"bucket": b.Meta.Seq, "round": b.Meta.Version, "bytes": b.Meta.Length})
	defer span.End()
	return ep.Broadcast(ctx, b.Meta.Seq, b.Buf, int(b.Meta.Length))
}
