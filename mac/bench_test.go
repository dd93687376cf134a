package mac

import (
	"fmt"
	"testing"

	"github.com/weightcast/weightcast/checksum"
)

// The benchmarks report the CPU MAC's rate on one goroutine (per core) and
// on all of them, next to checksum.Sum's on the same sizes.

var benchSizes = []int{1 << 20, 64 << 20}

func benchSum(b *testing.B, f func([]byte)) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("%dMiB", n>>20), func(b *testing.B) {
			buf := vectorInput(n)
			b.SetBytes(int64(n))
			for b.Loop() {
				f(buf)
			}
		})
	}
}

func BenchmarkSum(b *testing.B) { benchSum(b, func(p []byte) { Sum(&testKey, p) }) }

func BenchmarkSumParallel(b *testing.B) { benchSum(b, func(p []byte) { SumParallel(&testKey, p) }) }

func BenchmarkChecksumSum(b *testing.B) { benchSum(b, func(p []byte) { checksum.Sum(p) }) }

func BenchmarkChecksumSumParallel(b *testing.B) {
	benchSum(b, func(p []byte) { checksum.SumParallel(p) })
}

func BenchmarkPolySum(b *testing.B) {
	key, nonce := NewPolyKey(&[PolyKeySize]byte{1, 2, 3}), &Nonce{4}
	benchSum(b, func(p []byte) { PolySum(key, nonce, p) })
}

func BenchmarkPolySumParallel(b *testing.B) {
	key, nonce := NewPolyKey(&[PolyKeySize]byte{1, 2, 3}), &Nonce{4}
	benchSum(b, func(p []byte) { PolySumParallel(key, nonce, p) })
}
