package route

import (
	"context"
	"fmt"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/mem"
)

// engine does a pair's byte work where the rank's buffers live: packing a
// bucket's segments out of the sender's local tensors, sealing it,
// checking a received one's seal, and unpacking its segments into the
// receiver's local tensors. Each pair stage has its own (a device engine
// holds a stream), used by one goroutine at a time.
type engine interface {
	// pack fills buf's payload with b's segments out of held and writes
	// its seal after it (bucket seq of the pair from → to in round
	// version); the bucket may be sent when it returns.
	pack(ctx context.Context, s sealer, buf mem.Buffer, b *Bucket, held []mem.Buffer, version uint64, from, to int, seq uint64) error
	// check verifies the seal after buf's payload of n bytes.
	check(ctx context.Context, s sealer, buf mem.Buffer, n int, version uint64, from, to int, seq uint64) error
	// unpack copies b's segments out of buf into local; buf may be reused
	// when it returns.
	unpack(ctx context.Context, buf mem.Buffer, b *Bucket, local []mem.Buffer) error
	close(ctx context.Context) error
}

// newEngine returns the engine of buffers on dev.
func newEngine(dev mem.Device) (engine, error) {
	if dev.Kind() == mem.KindHost {
		return hostEngine{}, nil
	}
	d, ok := dev.(*gpu.CUDADevice)
	if !ok {
		return nil, fmt.Errorf("route: buffers on %s (%s), which is neither host memory nor a CUDA device", dev.Name(), dev.Kind())
	}
	return newGPUEngine(d)
}

// hostEngine is the engine of host memory: Go copies and the CPU's sums.
type hostEngine struct{}

func (hostEngine) pack(_ context.Context, s sealer, buf mem.Buffer, b *Bucket, held []mem.Buffer, version uint64, from, to int, seq uint64) error {
	h := buf.Host()
	end := int64(0)
	for _, seg := range b.Segments {
		clear(h[end:seg.Off]) // the gap before an 8-byte-aligned segment
		copy(h[seg.Off:seg.Off+seg.Len], held[seg.Held].Host()[seg.Src:seg.Src+seg.Len])
		end = seg.Off + seg.Len
	}
	n := int(b.Bytes)
	copy(h[n:], s.compute(h[:n], version, from, to, seq))
	return nil
}

func (hostEngine) check(_ context.Context, s sealer, buf mem.Buffer, n int, version uint64, from, to int, seq uint64) error {
	h := buf.Host()
	return s.verify(s.compute(h[:n], version, from, to, seq), h[n:n+s.size()], from, seq)
}

func (hostEngine) unpack(_ context.Context, buf mem.Buffer, b *Bucket, local []mem.Buffer) error {
	h := buf.Host()
	for _, seg := range b.Segments {
		copy(local[seg.Need].Host()[seg.Dst:seg.Dst+seg.Len], h[seg.Off:seg.Off+seg.Len])
	}
	return nil
}

func (hostEngine) close(context.Context) error { return nil }

// hostBytes is a Go byte slice as a mem.Buffer, for local tensors handed
// in as bytes.
type hostBytes []byte

func (b hostBytes) Len() int           { return len(b) }
func (b hostBytes) Host() []byte       { return b }
func (b hostBytes) DevicePtr() uint64  { return 0 }
func (b hostBytes) Device() mem.Device { return mem.Host{} }
func (b hostBytes) Free() error        { return nil }
