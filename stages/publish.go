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
// them once the GPU has computed them all but the last publishLead bytes'
// (see Sender's sumsFirst): the head of the run as soon as its own are
// in, the rest after the run's last.
func publishStage(p *pipeline.Pipeline, in *pipeline.Stream[*Bucket], pub transport.Publisher, sumsFirst bool) *pipeline.Stream[*Bucket] {
	return pipeline.Stage(p, "publish", in, 1, func(ctx context.Context, in *pipeline.Input[*Bucket], out *pipeline.Output[*Bucket]) error {
		var held []*Bucket // direct buckets waiting for their checksums or MACs
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
				run := held
				if pending {
					run = append(run[:len(run):len(run)], b)
				}
				// flush publishes the first n held buckets once upTo's
				// sum or MAC is in: the GPU computes them in order, so
				// theirs are in then.
				flush := func(upTo *Bucket, n int) error {
					if err := awaitGPU(ctx, upTo); err != nil {
						return err
					}
					for range n {
						h := held[0]
						held = held[1:]
						if err := send(h); err != nil {
							return err
						}
					}
					return nil
				}
				var err error
				if k := aheadOf(run, publishLead); k > 0 {
					err = flush(run[k-1], k)
				}
				if err == nil && len(held) > 0 {
					err = flush(run[len(run)-1], len(held))
				}
				if err != nil {
					b.Release()
					return err
				}
			}
			if err := send(b); err != nil {
				return err
			}
		}
		return in.Err()
	})
}

// publishLead is how many bytes of a held run's checksums or MACs may
// still be on the GPU when publishStage lets the run's first messages go.
// A round's first message meets a receiver that has idled while the
// sender summed, and the bus is several times slower after such a wait
// (zmqbus.BenchmarkRoundTrip): on one H200's host it spent 330–560 µs
// on the bus and 0.1–0.25 ms more before the first copy was queued, about
// what the sender's GPU takes to sum 2 GiB at 3.3 TB/s. Sent that much
// ahead, the receivers' first copies are queued as the sender's last sums
// end, not half a millisecond later: one receiver +11%, three +4% at 1 GiB
// buckets; no change at 256 MiB; 3 and 4 GiB did no better
// (docs/benchmarks.md, "A round's first messages ahead of its last
// checksums").
const publishLead = 2 << 30

// aheadOf returns how many buckets at the head of run may be published
// before the checksums or MACs of the rest are in: those that at least
// lead bytes of the run follow.
func aheadOf(run []*Bucket, lead int64) int {
	k, rest := len(run), int64(0)
	for k > 0 && rest < lead {
		k--
		rest += run[k].Meta.Length
	}
	return k
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
