package gpu

import (
	"testing"
)

// The copy benchmarks move 1 GiB per operation and report GB/s (10^9 bytes
// per second of bytes copied), stream-synchronized each time.

const benchBytes = 1 << 30

func benchCopy(b *testing.B, d *CUDADevice, run func(s *Stream) error) {
	s := testStream(b, d)
	if err := run(s); err != nil { // warm up
		b.Fatal(err)
	}
	syncStream(b, s)
	b.SetBytes(benchBytes)
	b.ResetTimer()
	for range b.N {
		if err := run(s); err != nil {
			b.Fatal(err)
		}
		syncStream(b, s)
	}
	b.ReportMetric(float64(benchBytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

func BenchmarkCopyHtoDPinned(b *testing.B) {
	d := testDevice(b)
	src := alloc(b, d.PinnedHost(), benchBytes)
	dst := alloc(b, d, benchBytes)
	benchCopy(b, d, func(s *Stream) error { return s.CopyHtoD(dst, 0, src.Host()) })
}

func BenchmarkCopyDtoHPinned(b *testing.B) {
	d := testDevice(b)
	src := alloc(b, d, benchBytes)
	dst := alloc(b, d.PinnedHost(), benchBytes)
	benchCopy(b, d, func(s *Stream) error { return s.CopyDtoH(dst.Host(), src, 0) })
}

func BenchmarkCopyHtoDPageable(b *testing.B) {
	d := testDevice(b)
	src := make([]byte, benchBytes)
	dst := alloc(b, d, benchBytes)
	benchCopy(b, d, func(s *Stream) error { return s.CopyHtoD(dst, 0, src) })
}

func BenchmarkCopyDtoD(b *testing.B) {
	d := testDevice(b)
	src := alloc(b, d, benchBytes)
	dst := alloc(b, d, benchBytes)
	benchCopy(b, d, func(s *Stream) error { return s.CopyDtoD(dst, 0, src, 0, benchBytes) })
}
