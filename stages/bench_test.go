package stages

import (
	"context"
	"fmt"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/pipeline"
	"github.com/weightcast/weightcast/wire"
)

// loopback is a pipeline that packs src and unpacks it again in one
// process, with no transport: iterate → pack → unpack → load(discard).
// The pool lives across rounds, as a Sender's does.
func loopback(b *testing.B, src Source, pool *Pool, sum bool) {
	p := pipeline.New("loopback")
	buckets := Pack(p, Iterate(p, src), PackConfig{Pool: pool, Version: 1, Checksum: sum})
	Load(p, Unpack(p, buckets), &countSink{})
	if err := p.Run(context.Background()); err != nil {
		b.Fatal(err)
	}
}

func benchPool(b *testing.B, bucket int) *Pool {
	pool, err := NewPool(mem.Host{}, DefaultBuffers, bucket)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pool.Close() })
	return pool
}

type countSink struct{ n int64 }

func (c *countSink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	c.n += int64(len(data))
	return nil
}
func (c *countSink) Commit(ctx context.Context, version uint64) error { return nil }

// hostModel makes count tensors of size bytes each, in host memory.
func hostModel(count, size int) tensorList {
	ts := make(tensorList, count)
	backing := make([]byte, count*size)
	for i := range backing {
		backing[i] = byte(i * 7)
	}
	for i := range ts {
		ts[i] = &Tensor{Name: fmt.Sprintf("model.layers.%d.weight", i), DType: dtype.U8, Shape: []int64{int64(size)}, Data: backing[i*size : (i+1)*size]}
	}
	return ts
}

// BenchmarkPackUnpack1GiB packs a 1 GiB model (256 tensors of 4 MiB) into
// 256 MiB buckets and unpacks it into views. Compare with BenchmarkCopy1GiB.
func BenchmarkPackUnpack1GiB(b *testing.B) {
	src := hostModel(256, 4<<20)
	pool := benchPool(b, 256<<20)
	b.SetBytes(1 << 30)
	for b.Loop() {
		loopback(b, src, pool, false)
	}
}

// BenchmarkCopy1GiB is one plain copy of the same bytes into a 256 MiB
// buffer, the baseline for BenchmarkPackUnpack1GiB.
func BenchmarkCopy1GiB(b *testing.B) {
	src := hostModel(256, 4<<20)
	dst := make([]byte, 256<<20)
	clear(dst) // touch the pages once, as the pool's buffers are touched in its first round
	b.SetBytes(1 << 30)
	for b.Loop() {
		off := 0
		for _, t := range src {
			if off+len(t.Data) > len(dst) {
				off = 0
			}
			copy(dst[off:], t.Data)
			off += len(t.Data)
		}
	}
}

// BenchmarkPerTensor moves 100,000 tensors of 1 KiB through
// pack and unpack; ns/op divided by 100,000 is the cost per tensor,
// copying included (BenchmarkPerTensorCopy is the copying alone).
func BenchmarkPerTensor(b *testing.B) {
	src := hostModel(100_000, 1<<10)
	pool := benchPool(b, 64<<20)
	b.SetBytes(100_000 << 10)
	for b.Loop() {
		loopback(b, src, pool, false)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100_000, "ns/tensor")
}

// BenchmarkPerTensorCopy copies the same 100,000 tensors of 1 KiB into
// buckets by hand: the copying that BenchmarkPerTensor cannot avoid.
func BenchmarkPerTensorCopy(b *testing.B) {
	src := hostModel(100_000, 1<<10)
	dst := make([]byte, 64<<20)
	b.SetBytes(100_000 << 10)
	for b.Loop() {
		off := 0
		for _, t := range src {
			if off+len(t.Data) > len(dst) {
				off = 0
			}
			copy(dst[off:], t.Data)
			off += (len(t.Data) + wire.Align - 1) &^ (wire.Align - 1)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/100_000, "ns/tensor")
}
