package stages

import (
	"context"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// The broadcast stage moves each bucket's filled bytes from the root to
// every receiver through a transport.Endpoint, which every rank calls for
// the same buckets in the same order, as NCCL's broadcast is called: on
// the root it is the last stage (Broadcast), on a receiver the stage after
// subscribe (Receive). Both wait until the transport is done with the
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

// Receive adds a receiver's transport stage, "receive": each bucket's bytes
// land in its buffer through ep before the bucket is passed on (a direct
// bucket's gathered from the sender's memory, with a Loader of its own).
func Receive(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], ep transport.Endpoint) *pipeline.Stream[*Bucket] {
	return receiveStage(p, in, ep, nil, nil)
}

// Receive adds the stage that Receive adds, with the Loader's mappings of
// the sender's memory and GPU state, for the Loader's Load stage into sink:
// where sink is one DeviceTarget, direct buckets are left where they lie,
// for Load to copy into it from there; where it is one InPlaceReader, they
// are left there too, their checksums summed there by this stage.
func (ld *Loader) Receive(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], ep transport.Endpoint, sink Sink) *pipeline.Stream[*Bucket] {
	return receiveStage(p, in, ep, ld, sink)
}

func receiveStage(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], ep transport.Endpoint, ld *Loader, sink Sink) *pipeline.Stream[*Bucket] {
	return pipeline.Stage(p, "receive", in, 1, func(ctx context.Context, in *pipeline.Input[*Bucket], out *pipeline.Output[*Bucket]) (err error) {
		use := directGather
		switch {
		case ld != nil && fusedTarget(sink) != nil:
			use = directLeave
		case ld != nil && readsInPlace(sink):
			use = directSum
		}
		lender, lends := ep.(transport.Lender)
		lends = lends && lender.Lends()
		if ld == nil {
			ld = NewLoader()
			defer func() { err = errors.Join(err, ld.Close()) }()
		}
		for b := range in.All() {
			var err error
			switch {
			case b.Meta.Direct != nil:
				err = ld.receiveDirect(ctx, b, use)
			case lends && b.Meta.Length > 0:
				err = borrow(ctx, b, lender)
			default:
				err = move(ctx, b, ep)
			}
			if err != nil {
				pipeline.Fail(ctx, err) // before a lent bucket's release tells the root
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

// borrow receives b by borrowing the root's buffer that holds it (see
// Bucket.lend).
func borrow(ctx context.Context, b *Bucket, l transport.Lender) error {
	span := pipeline.StartSpan(ctx, fmt.Sprintf("bucket %d", b.Meta.Seq), map[string]any{"bucket": b.Meta.Seq, "round": b.Meta.Version, "lent": true})
	defer span.End()
	buf, release, err := l.Lend(ctx, b.Meta.Seq, int(b.Meta.Length))
	if err != nil {
		return err
	}
	b.lend(buf, release)
	return nil
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
