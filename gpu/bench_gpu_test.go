package gpu

import (
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
)

// The copy benchmarks move 1 GiB per operation (most of them) and report
// GB/s (10^9 bytes per second of the bytes they copy), stream-synchronized
// each time.

const benchBytes = 1 << 30

// benchCopy runs one copy benchmark on a new stream of d: each operation
// is run, which copies bytes bytes, then a wait for the stream.
func benchCopy(b *testing.B, d *CUDADevice, bytes int64, run func(s *Stream) error) {
	s := testStream(b, d)
	if err := run(s); err != nil { // warm up
		b.Fatal(err)
	}
	syncStream(b, s)
	b.SetBytes(bytes)
	b.ResetTimer()
	for range b.N {
		if err := run(s); err != nil {
			b.Fatal(err)
		}
		syncStream(b, s)
	}
	b.ReportMetric(float64(bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// benchScattered is the benchmark of many small copies: each operation
// adds count copies of size bytes between every other size-byte range of
// src and dst (so that no two merge) to cb, hands cb to queue and waits for
// s; after one such operation to warm up it reports the cost per copy,
// queueing plus execution.
func benchScattered(b *testing.B, s *Stream, src, dst mem.Buffer, count, size int, cb *CopyBatch, queue func(*CopyBatch) error) {
	run := func() {
		for i := range count {
			off := uint64(i) * 2 * uint64(size)
			cb.Add(dst.DevicePtr()+off, src.DevicePtr()+off, int64(size))
		}
		if err := queue(cb); err != nil {
			b.Fatal(err)
		}
		syncStream(b, s)
	}
	run()
	b.SetBytes(int64(count * size))
	b.ResetTimer()
	for range b.N {
		run()
	}
	per := b.Elapsed() / time.Duration(b.N*count)
	b.ReportMetric(float64(per.Nanoseconds())/1000, "µs/copy")
}

func BenchmarkCopyHtoDPinned(b *testing.B) {
	d := testDevice(b)
	src := alloc(b, d.PinnedHost(), benchBytes)
	dst := alloc(b, d, benchBytes)
	benchCopy(b, d, benchBytes, func(s *Stream) error { return s.CopyHtoD(dst, 0, src.Host()) })
}

func BenchmarkCopyDtoHPinned(b *testing.B) {
	d := testDevice(b)
	src := alloc(b, d, benchBytes)
	dst := alloc(b, d.PinnedHost(), benchBytes)
	benchCopy(b, d, benchBytes, func(s *Stream) error { return s.CopyDtoH(dst.Host(), src, 0) })
}

func BenchmarkCopyHtoDPageable(b *testing.B) {
	d := testDevice(b)
	src := make([]byte, benchBytes)
	dst := alloc(b, d, benchBytes)
	benchCopy(b, d, benchBytes, func(s *Stream) error { return s.CopyHtoD(dst, 0, src) })
}

func BenchmarkCopyDtoD(b *testing.B) {
	d := testDevice(b)
	src := alloc(b, d, benchBytes)
	dst := alloc(b, d, benchBytes)
	benchCopy(b, d, benchBytes, func(s *Stream) error { return s.CopyDtoD(dst, 0, src, 0, benchBytes) })
}
