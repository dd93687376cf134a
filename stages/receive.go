package stages

import (
	"context"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/transport"
)

// The receive stage is a receiver's side of the broadcast (broadcast.go):
// each bucket's bytes land in the receiver's buffer, or, where the
// endpoint lends, the bucket borrows the root's buffer.

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
				if use == directGather {
					err = b.ownBuffer(ctx)
				}
				if err == nil {
					err = ld.receiveDirect(ctx, b, use)
				}
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
