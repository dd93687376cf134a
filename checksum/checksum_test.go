package checksum

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParallelMatchesSerial(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 7, 8, 9, 31, 33, parallelMin - 1, parallelMin + 13, 3*parallelMin + 5} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if Sum(b) != SumParallel(b) {
			t.Fatalf("n=%d: parallel and serial sums differ", n)
		}
	}
}

// TestDetectsChanges: any single bit flip, a swap of two words, and a
// change of length (trailing zero) all change the sum.
func TestDetectsChanges(t *testing.T) {
	b := make([]byte, 4096+3)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	base := Sum(b)
	for bit := 0; bit < len(b)*8; bit += 7 {
		b[bit/8] ^= 1 << (bit % 8)
		if Sum(b) == base {
			t.Fatalf("flip of bit %d not detected", bit)
		}
		b[bit/8] ^= 1 << (bit % 8)
	}
	c := append([]byte(nil), b...)
	copy(c[0:8], b[8:16])
	copy(c[8:16], b[0:8])
	if Sum(c) == base {
		t.Fatal("word swap not detected")
	}
	if Sum(append(b, 0)) == base {
		t.Fatal("appended zero byte not detected")
	}
	if Sum(nil) == Sum([]byte{0}) {
		t.Fatal("empty and one zero byte collide")
	}
}

// TestKnownValues pins the function (values computed by an independent
// Python implementation of the package doc) so that other implementations (the
// GPU kernel, clients in other languages) can be checked against it.
func TestKnownValues(t *testing.T) {
	seq := make([]byte, 20)
	for i := range seq {
		seq[i] = byte(i)
	}
	cases := []struct {
		in   []byte
		want uint64
	}{
		{nil, 0x0},
		{[]byte("weightcast"), 0x4249e24502faf7e6},
		{seq, 0x38cd3014096d9e16},
	}
	for _, c := range cases {
		if got := Sum(c.in); got != c.want {
			t.Errorf("Sum(%q) = %#x, want %#x", c.in, got, c.want)
		}
	}
}

func BenchmarkSum(b *testing.B) {
	buf := make([]byte, 64<<20)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		Sum(buf)
	}
}

func BenchmarkSumParallel(b *testing.B) {
	buf := make([]byte, 64<<20)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		SumParallel(buf)
	}
}

func TestDigestMatchesSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	b := make([]byte, 10_000)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	for range 200 {
		var d Digest
		rest := b[:rng.IntN(len(b))]
		want := Sum(rest)
		for len(rest) > 0 {
			n := min(len(rest), rng.IntN(40))
			d.Write(rest[:n])
			rest = rest[n:]
		}
		if d.Sum64() != want {
			t.Fatal("digest over pieces differs from Sum")
		}
	}
}

// contribution is word i's term of the sum, written out from the package
// doc rather than taken from partial.
func contribution(b []byte, i int) uint64 {
	var w [8]byte
	copy(w[:], b[8*i:min(len(b), 8*i+8)])
	return fmix64(binary.LittleEndian.Uint64(w[:]) + uint64(i+1)*0x9e3779b97f4a7c15)
}

// TestFinish adds the words' contributions the way a GPU does (in random
// groups, in random order) and checks that Finish of the total is Sum;
// a wrong length or a missing word gives another checksum.
func TestFinish(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 1000, 4099} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		words := (n + 7) / 8
		slots := make([]uint64, 1+rng.IntN(5))
		for _, i := range rng.Perm(words) {
			slots[rng.IntN(len(slots))] += contribution(b, i)
		}
		var sum uint64
		for _, s := range slots {
			sum += s
		}
		want := Sum(b)
		if got := Finish(sum, int64(n)); got != want {
			t.Fatalf("n=%d: Finish = %#x, Sum = %#x", n, got, want)
		}
		if Finish(sum, int64(n)+1) == want {
			t.Fatalf("n=%d: Finish ignores the length", n)
		}
		if words > 0 && Finish(sum-contribution(b, words-1), int64(n)) == want {
			t.Fatalf("n=%d: Finish ignores the last word", n)
		}
	}
	if Finish(0, 0) != Sum(nil) {
		t.Fatal("Finish(0, 0) is not the checksum of nothing")
	}
}

// TestTerm: the sum of the words' terms, finished, is Sum.
func TestTerm(t *testing.T) {
	b := []byte("0123456789abcdef01234567")
	var s uint64
	for i := range 3 {
		s += Term(binary.LittleEndian.Uint64(b[8*i:]), uint64(i))
	}
	if Finish(s, int64(len(b))) != Sum(b) {
		t.Fatal("Finish of the terms is not Sum")
	}
}
