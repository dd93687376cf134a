package cast

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

// benchConvert converts 64 MiB of source elements; throughput (MB/s and
// GB/s) counts source bytes.
func benchConvert(b *testing.B, dstType, srcType dtype.DType) {
	const srcBytes = 64 << 20
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, srcBytes)
	for i := 0; i < srcBytes; i += 4 {
		// Normal-range weights, like a checkpoint's.
		binary.LittleEndian.PutUint32(src[i:], math.Float32bits(float32(rng.NormFloat64()*0.02)))
	}
	if srcType != dtype.F32 { // make valid 16-bit inputs from the F32 ones
		half := make([]byte, srcBytes)
		tmp := make([]byte, srcBytes/2)
		Convert(tmp, srcType, src[:srcBytes], dtype.F32)
		copy(half, tmp)
		Convert(half[srcBytes/2:], srcType, src[:srcBytes], dtype.F32)
		src = half
	}
	dst := make([]byte, srcBytes/srcType.Size()*dstType.Size())
	b.SetBytes(srcBytes)
	for b.Loop() {
		if err := Convert(dst, dstType, src, srcType); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(srcBytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

func BenchmarkConvert64MiB(b *testing.B) {
	b.Run("F32toBF16", func(b *testing.B) { benchConvert(b, dtype.BF16, dtype.F32) })
	b.Run("F32toF16", func(b *testing.B) { benchConvert(b, dtype.F16, dtype.F32) })
	b.Run("BF16toF16", func(b *testing.B) { benchConvert(b, dtype.F16, dtype.BF16) })
	b.Run("F16toBF16", func(b *testing.B) { benchConvert(b, dtype.BF16, dtype.F16) })
}
