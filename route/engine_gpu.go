package route

import (
	"context"
	"errors"
	"fmt"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
)

// gpuEngine is the engine of device buffers on one GPU: the gather kernel
// copies segments (one launch per bucket), the checksum or keyed BLAKE3
// kernel computes the seal's input on the GPU, and only the seal's few
// bytes cross to or from the host. Local tensors must be device memory of
// the same GPU.
type gpuEngine struct {
	dev    *gpu.CUDADevice
	s      *gpu.Stream
	gather *gpu.Gather
	sums   *gpu.Checksummer
	macs   *gpu.MACer
	batch  gpu.CopyBatch
	tail   []byte // the seal's bytes, read back or written
}

func newGPUEngine(d *gpu.CUDADevice) (*gpuEngine, error) {
	s, err := d.NewStream()
	if err != nil {
		return nil, err
	}
	return &gpuEngine{dev: d, s: s, gather: s.NewGather()}, nil
}

// addr returns b's device address on the engine's GPU.
func (e *gpuEngine) addr(b mem.Buffer, what string) (uint64, error) {
	p, ok := gpu.Address(b)
	if !ok || b.Host() != nil {
		return 0, fmt.Errorf("route: %s is not device memory of %s: a routed group on a GPU takes CUDA tensors of that GPU", what, e.dev.Name())
	}
	return p, nil
}

func (e *gpuEngine) pack(ctx context.Context, s sealer, buf mem.Buffer, b *Bucket, held []mem.Buffer, version uint64, from, to int, seq uint64) error {
	dst, err := e.addr(buf, "a bucket")
	if err != nil {
		return err
	}
	e.batch.Reset()
	for _, seg := range b.Segments {
		src, err := e.addr(held[seg.Held], "a shard")
		if err != nil {
			return err
		}
		e.batch.Add(dst+uint64(seg.Off), src+uint64(seg.Src), seg.Len)
	}
	n := int(b.Bytes)
	if s.keys == nil && s.checksum {
		// The checksum as the copies write the bucket: no pass of its own.
		if e.sums == nil {
			if e.sums, err = e.s.NewChecksummer(); err != nil {
				return err
			}
		}
		p, err := e.gather.CopySum(ctx, &e.batch, gpu.SumOf{Buf: buf, N: int64(n), Side: gpu.SumDst, Sums: e.sums})
		if err != nil {
			return err
		}
		defer p.Close()
		sum, err := p.Wait(ctx)
		if err != nil {
			return err
		}
		return e.writeSeal(ctx, buf, n, s.fromDigest(sum, mac.Tag{}, version, from, to, n, seq))
	}
	if err := e.gather.Copy(ctx, &e.batch); err != nil {
		return err
	}
	var seal []byte
	if s.size() > 0 {
		sum, tag, err := e.digest(ctx, s, buf, n)
		if err != nil {
			return err
		}
		seal = s.fromDigest(sum, tag, version, from, to, n, seq)
	}
	return e.writeSeal(ctx, buf, n, seal)
}

// writeSeal writes seal after the payload and waits for the stream: the
// bucket is whole before it is sent.
func (e *gpuEngine) writeSeal(ctx context.Context, buf mem.Buffer, n int, seal []byte) error {
	if len(seal) > 0 {
		if err := e.s.CopyHtoD(buf, n, seal); err != nil {
			return err
		}
	}
	return e.s.Sync(ctx)
}

// digest computes what the seal covers of buf's payload on the GPU: the
// checksum (8 bytes, big-endian) or the keyed BLAKE3 tag, after the work
// queued on the stream.
func (e *gpuEngine) digest(ctx context.Context, s sealer, buf mem.Buffer, n int) (sum uint64, tag mac.Tag, err error) {
	if s.keys != nil {
		if e.macs == nil {
			if e.macs, err = e.s.NewMACer(); err != nil {
				return 0, tag, err
			}
		}
		key := mac.Key(s.keys.BucketKey())
		p, err := e.macs.Queue(buf, int64(n), &key)
		if err != nil {
			return 0, tag, err
		}
		defer p.Close()
		tag, err = p.Wait(ctx)
		return 0, tag, err
	}
	if e.sums == nil {
		if e.sums, err = e.s.NewChecksummer(); err != nil {
			return 0, tag, err
		}
	}
	p, err := e.sums.Queue(buf, int64(n))
	if err != nil {
		return 0, tag, err
	}
	defer p.Close()
	sum, err = p.Wait(ctx)
	return sum, tag, err
}

func (e *gpuEngine) check(ctx context.Context, s sealer, buf mem.Buffer, n int, version uint64, from, to int, seq uint64) error {
	if s.size() == 0 {
		return nil
	}
	sum, tag, err := e.digest(ctx, s, buf, n)
	if err != nil {
		return err
	}
	if len(e.tail) != s.size() {
		e.tail = make([]byte, s.size())
	}
	if err := e.s.CopyDtoH(e.tail, buf, n); err != nil {
		return err
	}
	if err := e.s.Sync(ctx); err != nil {
		return err
	}
	return s.verify(s.fromDigest(sum, tag, version, from, to, n, seq), e.tail, from, seq)
}

func (e *gpuEngine) unpack(ctx context.Context, buf mem.Buffer, b *Bucket, local []mem.Buffer) error {
	src, err := e.addr(buf, "a bucket")
	if err != nil {
		return err
	}
	e.batch.Reset()
	for _, seg := range b.Segments {
		dst, err := e.addr(local[seg.Need], "a destination tensor")
		if err != nil {
			return err
		}
		e.batch.Add(dst+uint64(seg.Dst), src+uint64(seg.Off), seg.Len)
	}
	if err := e.gather.Copy(ctx, &e.batch); err != nil {
		return err
	}
	return e.s.Sync(ctx) // buf may be reused: every copy out of it is done
}

func (e *gpuEngine) close(ctx context.Context) error {
	var errs []error
	errs = append(errs, e.gather.Close(ctx))
	if e.sums != nil {
		errs = append(errs, e.sums.Close(ctx))
	}
	if e.macs != nil {
		errs = append(errs, e.macs.Close(ctx))
	}
	return errors.Join(append(errs, e.s.Close())...)
}
