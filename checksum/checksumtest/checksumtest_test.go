package checksumtest

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/weightcast/weightcast/checksum"
)

// TestForge: forged bytes at any aligned offset of an input keep its
// checksum while 64 of its bytes change.
func TestForge(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{72, 73, 1000, 1 << 20} {
		for _, off := range []int{0, 8, 64, n - 72} {
			if off &^= 7; off+ForgedLen > n {
				continue
			}
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			orig := bytes.Clone(b)
			Forge(b[off:], uint64(off/8))
			if bytes.Equal(b[off:off+64], orig[off:off+64]) {
				t.Fatalf("%d bytes at %d: nothing changed", n, off)
			}
			if checksum.Sum(b) != checksum.Sum(orig) || checksum.SumParallel(b) != checksum.Sum(orig) {
				t.Fatalf("%d bytes at %d: the checksum changed from %x to %x", n, off, checksum.Sum(orig), checksum.Sum(b))
			}
		}
	}
	for _, c := range []uint64{0xff51afd7ed558ccd, 0xc4ceb9fe1a85ec53} {
		if c*inverse(c) != 1 {
			t.Errorf("inverse(%#x) is wrong", c)
		}
	}
	for _, k := range []uint64{0, 1, 1 << 63, 0x0123456789abcdef} {
		if got := unfmix64(checksum.Term(k, 0)) - phi; got != k {
			t.Errorf("unfmix64 does not invert Term's fmix64: %#x gave %#x", k, got)
		}
	}
}
