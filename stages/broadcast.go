package stages

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// The broadcast stage moves each bucket's filled bytes from the root to
// every receiver through a transport.Endpoint, which every rank calls for
// the same buckets in the same order, as NCCL's broadcast is called: on
// the root it is the last stage (Broadcast, here), on a receiver the stage
// after subscribe (Receive, in receive.go). Both wait until the transport is done with the
// bucket, so their spans time the transfer itself. A direct bucket
// (BucketMeta.Direct) never reaches the transport: on the root nothing
// moves, and a receiver maps the sender's memory the entries lie in and,
// unless its sink copies from there itself, gathers them into its own
// buffer. On a receiver whose endpoint lends it the root's buffer
// (transport.Lender: ipc, on the root's GPU), receive borrows it instead of
// copying the bucket into its own: the later stages read the root's
// buffer, and releasing the bucket gives it back to the root.

// Broadcast adds the root's last stage: it moves each bucket's filled bytes
// to every receiver through ep, then releases the bucket and, when done is
// not nil, calls it with the bucket's metadata (for progress reports).
func Broadcast(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], ep transport.Endpoint, done func(*wire.BucketMeta)) {
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

// move is one rank's part of the broadcast of b; nothing for a direct
// bucket on the root.
func move(ctx context.Context, b *Bucket, ep transport.Endpoint) error {
	if b.Meta.Direct != nil {
		return nil
	}
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", b.Meta.Seq), map[string]any{"bucket": b.Meta.Seq, "round": b.Meta.Version, "bytes": b.Meta.Length})
	defer span.End()
	return ep.Broadcast(ctx, b.Meta.Seq, b.Buf, int(b.Meta.Length))
}
