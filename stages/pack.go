package stages

import (
	"context"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/internal/parallel"
	"github.com/weightcast/weightcast/pipeline"
)

// Iterate adds the source stage that yields src's tensors. The runner closes
// the returned stream after the last one.
func Iterate(p *pipeline.Pipeline, src Source) *pipeline.Stream[*Tensor] {
	return pipeline.Source(p, "iterate", 64, func(ctx context.Context, out *pipeline.Output[*Tensor]) error {
		return src.Tensors(ctx, out.Send)
	})
}

// PackConfig says how Pack fills buckets.
type PackConfig struct {
	// Pool supplies the bucket buffers; its buffer size is the bucket size.
	Pool *Pool
	// Version is the model version of the round.
	Version uint64
	// FirstSeq is the Seq of the round's first bucket.
	FirstSeq uint64
	// Checksum computes each bucket's checksum (checked by receivers).
	Checksum bool
	// Source, when set, travels in the round's first bucket.
	Source *SourceInfo
}

// Pack adds the stage that copies tensors into bucket buffers taken from
// cfg.Pool. A bucket is sent on when the next tensor does not fit; a tensor
// larger than a bucket is split into chunks (on Align boundaries) across
// buckets; the last bucket of the round carries IsLast, and a round with no
// tensors still sends one empty last bucket. A tensor name seen twice, or a
// tensor that fails Validate, stops the round with an error naming it.
//
// When the pool's buffers are device memory, the buckets are filled on the
// GPU and travel fenced (see gpu_pack.go): host tensors through pinned
// staging, device tensors (Tensor.Device) device to device, in batched
// copies; their checksums are computed on the GPU, and Publish sends them
// once known.
func Pack(p *pipeline.Pipeline, in *pipeline.Stream[*Tensor], cfg PackConfig) *pipeline.Stream[*Bucket] {
	return pipeline.Stage(p, "pack", in, 1, func(ctx context.Context, in *pipeline.Input[*Tensor], out *pipeline.Output[*Bucket]) (err error) {
		pk := packer{ctx: ctx, cfg: cfg, out: out, seq: cfg.FirstSeq, seen: map[string]struct{}{}, bsize: int64(cfg.Pool.BufferSize())}
		if isDevicePool(cfg.Pool) {
			if pk.dev = cfg.Pool.takeFill(); pk.dev == nil {
				if pk.dev, err = newDeviceFill(cfg.Pool); err != nil {
					return err
				}
			}
			defer func() { err = errors.Join(err, pk.dev.endRound(ctx, cfg.Pool, err != nil)) }()
		}
		defer func() { err = errors.Join(err, pk.abandon()) }()
		for t := range in.All() {
			if err := pk.add(t); err != nil {
				return err
			}
		}
		if err := in.Err(); err != nil {
			return err
		}
		if err := pk.take(); err != nil {
			return err
		}
		return pk.emit(true)
	})
}

type packer struct {
	ctx   context.Context
	cfg   PackConfig
	out   *pipeline.Output[*Bucket]
	bsize int64
	seq   uint64
	index int
	seen  map[string]struct{}

	cur  *Bucket // the bucket being filled, nil between buckets
	buf  []byte  // the host bytes of cur; nil for a device bucket
	fill int64
	span *pipeline.Span
	dev  *deviceFill // queues the copies of device buckets; nil for host buckets
}

func alignUp(n int64) int64 { return (n + Align - 1) &^ (Align - 1) }

// take makes sure a bucket is being filled, waiting for a free buffer.
func (pk *packer) take() error {
	if pk.cur != nil {
		return nil
	}
	buf, err := pk.cfg.Pool.Get(pk.ctx)
	if err != nil {
		return err
	}
	if buf.Host() == nil && pk.dev == nil {
		pk.cfg.Pool.Put(buf)
		return fmt.Errorf("pack: bucket buffers on %s are not host memory; use the GPU pack stage", buf.Device().Name())
	}
	pk.cur = pk.cfg.Pool.Bucket(buf, BucketMeta{Seq: pk.seq, Index: pk.index, Version: pk.cfg.Version})
	if pk.index == 0 {
		pk.cur.Meta.Source = pk.cfg.Source
	}
	pk.buf, pk.fill = buf.Host(), 0
	pk.span = pipeline.StartSpan(pk.ctx, fmt.Sprintf("bucket %d", pk.seq), map[string]any{"bucket": pk.seq, "round": pk.cfg.Version})
	pipeline.Count(pk.ctx, "buffers held", float64(pk.cfg.Pool.Held()))
	return nil
}

// emit finishes the current bucket and sends it downstream.
func (pk *packer) emit(last bool) error {
	b := pk.cur
	b.Meta.Length, b.Meta.IsLast = pk.fill, last
	if pk.dev != nil {
		if err := pk.dev.finish(pk.ctx, b); err != nil {
			return err // abandon releases b once its copies are done
		}
		if pk.cfg.Checksum {
			if err := pk.dev.queueSum(b); err != nil {
				return err // abandon releases b once its copies are done
			}
		}
	} else if pk.cfg.Checksum {
		b.Meta.Checksum, b.Meta.HasChecksum = checksum.SumParallel(pk.buf[:pk.fill]), true
	}
	if pk.span != nil {
		pk.span.Args(map[string]any{"bytes": pk.fill, "entries": len(b.Meta.Entries)})
		pk.span.End()
	}
	pk.cur, pk.buf, pk.span = nil, nil, nil
	pk.seq++
	pk.index++
	return pk.out.Send(b) // on failure Send releases b
}

// abandon gives back a bucket still being filled when the stage stops early
// (a device bucket once the copies into it have finished).
func (pk *packer) abandon() error {
	b := pk.cur
	if b == nil {
		return nil
	}
	pk.cur = nil
	if pk.dev != nil {
		return pk.dev.abandon(pk.ctx, b)
	}
	b.Release()
	return nil
}

func (pk *packer) add(t *Tensor) error {
	size, err := t.Validate()
	if err != nil {
		return err
	}
	if _, dup := pk.seen[t.Name]; dup {
		return fmt.Errorf("tensor %q appears twice in round %d; tensor names must be unique", t.Name, pk.cfg.Version)
	}
	if len(pk.seen) >= maxTensors {
		return fmt.Errorf("round %d has more than %d tensors (at %q); receivers refuse more", pk.cfg.Version, maxTensors, t.Name)
	}
	pk.seen[t.Name] = struct{}{}
	// A tensor that fits in one bucket is never split: if it does not fit
	// in what is left of this one, start the next.
	if pk.cur != nil && len(pk.cur.Meta.Entries) > 0 && size <= pk.bsize && alignUp(pk.fill)+size > pk.bsize {
		if err := pk.emit(false); err != nil {
			return err
		}
	}
	for chunk := int64(0); chunk < size || (size == 0 && chunk == 0); {
		if err := pk.take(); err != nil {
			return err
		}
		off := alignUp(pk.fill)
		if size == 0 {
			off = pk.fill // no bytes: never pushes past the filled length
		}
		room := pk.bsize - off
		n := min(size-chunk, room)
		if n < size-chunk {
			n &^= Align - 1 // split on Align boundaries within the tensor
		}
		if n <= 0 && size > 0 {
			if err := pk.emit(false); err != nil {
				return err
			}
			continue
		}
		if pk.dev != nil {
			err = pk.dev.copyIn(pk.ctx, t, pk.cur.Buf, off, n, chunk)
		} else {
			// A large read runs on several goroutines, in pieces that
			// start on Align boundaries of the tensor (whole elements for
			// a cast reader).
			err = parallel.Pieces(pk.ctx, n, func(o, k int64) error {
				return t.ReadAt(pk.buf[off+o:off+o+k], chunk+o)
			})
		}
		if err != nil {
			return err
		}
		pk.cur.Meta.Entries = append(pk.cur.Meta.Entries, Entry{
			Name: t.Name, DType: t.DType, Shape: t.Shape, Offset: off, Size: n, Chunk: chunk, Total: size,
		})
		pk.fill = off + n
		chunk += n
		if size == 0 {
			break
		}
	}
	return nil
}
