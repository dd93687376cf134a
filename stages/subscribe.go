package stages

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// Subscribe adds a receiver's source stage: it takes each bucket's metadata
// from sub, checks it, takes a buffer from pool for its bytes (a direct
// bucket, read in the sender's memory, takes none: see Pool.directBucket),
// and stops after the bucket marked IsLast. firstSeq is the Seq the round
// must start at (the receiver's count of messages so far). With keys (the run's, when
// the group has a secret) every message must be signed with them, and
// every bucket's MAC is checked by Unpack (see mac.go); without, no
// message may be signed.
func Subscribe(p *pipeline.Pipeline, sub transport.Subscriber, pool *Pool, firstSeq uint64, keys *auth.Keys) *pipeline.Stream[*Bucket] {
	return pipeline.Source(p, "subscribe", 1, func(ctx context.Context, out *pipeline.Output[*Bucket]) error {
		want := firstSeq
		var version uint64
		for index := 0; ; index++ {
			msg, err := sub.Recv(ctx)
			if err != nil {
				return err
			}
			// The span starts when the message is in hand, so that a trace
			// shows the bus's latency (from the root's publish span) apart
			// from the work here: checking and decoding the message, and
			// taking a buffer for its bytes. It ends before the hand-off,
			// which waits for the next stage.
			span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", msg.Seq), map[string]any{"bucket": msg.Seq, "meta_bytes": len(msg.Data)})
			data, err := wire.Open(keys, msg.Seq, msg.Data)
			if err != nil {
				return fmt.Errorf("the metadata of bucket %d: %w", msg.Seq, err)
			}
			if wire.IsCommit(data) {
				return fmt.Errorf("message %d is a commit message (%s) where the metadata of bucket %d was expected: the root and this rank disagree on where the round ends", msg.Seq, wire.Excerpt(data), want)
			}
			meta, err := wire.DecodeMeta(data)
			if err != nil {
				return err
			}
			switch {
			case meta.Seq != msg.Seq || meta.Seq != want:
				return fmt.Errorf("bucket metadata out of order: message %d carries bucket %d, expected bucket %d", msg.Seq, meta.Seq, want)
			case meta.Index != index:
				return fmt.Errorf("bucket %d has index %d in its round, expected %d", meta.Seq, meta.Index, index)
			case index > 0 && meta.Version != version:
				return fmt.Errorf("bucket %d has model version %d in a round of version %d", meta.Seq, meta.Version, version)
			case meta.Length > int64(pool.BufferSize()):
				return fmt.Errorf("bucket %d holds %d bytes but this rank's buckets hold %d; start every rank with the same bucket size", meta.Seq, meta.Length, pool.BufferSize())
			}
			version = meta.Version
			want++
			var b *Bucket
			if meta.Direct != nil {
				b = pool.directBucket(*meta)
			}
			if b == nil { // not direct, or a pool of host buffers (receive says why that cannot read it)
				buf, err := pool.Get(ctx)
				if err != nil {
					return err
				}
				b = pool.Bucket(buf, *meta)
			}
			b.auth = keys
			seq := meta.Seq
			b.Ack = func() error { return sub.Ack(ctx, seq) }
			pipeline.Count(ctx, "buffers held", float64(pool.Held()))
			span.Args(map[string]any{"round": meta.Version, "entries": len(meta.Entries)})
			span.End()
			if err := out.Send(b); err != nil {
				return err
			}
			if meta.IsLast {
				return nil
			}
		}
	})
}
