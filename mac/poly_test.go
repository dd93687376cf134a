package mac

import (
	"bytes"
	"crypto/aes"
	"encoding/hex"
	"math/big"
	"math/rand/v2"
	"strings"
	"testing"

	"golang.org/x/crypto/poly1305"
)

// polyP is 2^130 - 5.
var polyP = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 130), big.NewInt(5))

func limbsBig(h Limbs) *big.Int {
	v := new(big.Int)
	for j := 4; j >= 0; j-- {
		v.Lsh(v, 26).Add(v, big.NewInt(int64(h[j])))
	}
	return v
}

// polyReference returns the Poly1305-AES tag of b by its definition, from
// golang.org/x/crypto/poly1305 (the one-time Poly1305 under r and
// AES_k(nonce)) and crypto/aes.
func polyReference(t *testing.T, key *PolyKey, nonce *Nonce, b []byte) PolyTag {
	t.Helper()
	kb := key.Bytes()
	c, err := aes.NewCipher(kb[:16])
	if err != nil {
		t.Fatal(err)
	}
	var one [32]byte
	copy(one[:16], kb[16:])
	c.Encrypt(one[16:], nonce[:])
	var tag [16]byte
	poly1305.Sum(&tag, b, &one)
	return PolyTag(tag)
}

func randomPolyKey(rng *rand.Rand) (*PolyKey, *Nonce) {
	var kb [PolyKeySize]byte
	var n Nonce
	for i := range kb {
		kb[i] = byte(rng.Uint32())
	}
	for i := range n {
		n[i] = byte(rng.Uint32())
	}
	return NewPolyKey(&kb), &n
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for j := 0; j < n; j += 8 {
		v := rng.Uint64()
		for k := j; k < min(j+8, n); k++ {
			b[k] = byte(v >> (8 * (k - j)))
		}
	}
	return b
}

// TestPolyRFC8439 checks the polynomial and the pad's addition against
// the Poly1305 example of RFC 8439, section 2.5.2 (r and s given).
func TestPolyRFC8439(t *testing.T) {
	raw, _ := hex.DecodeString("85d6be7857556d337f4452fe42d506a80103808afb0db2fd4abff6af4149f51b")
	var kb [PolyKeySize]byte
	copy(kb[16:], raw[:16]) // r; k is unused here
	key := NewPolyKey(&kb)
	var s [16]byte
	copy(s[:], raw[16:])
	msg := []byte("Cryptographic Forum Research Group")
	got := addPad(key.segment(msg, 0, PolyBlocks(int64(len(msg)))), &s)
	if want := "a8061dc1305136c6c22b8baf0c0127a9"; got.String() != want {
		t.Errorf("tag %s, want %s", got, want)
	}
}

// TestPolySum compares PolySum and the parallel sum on 1 to 16 goroutines
// with the reference, over sizes around Poly1305's blocks and the
// parallel sum's pieces, under random keys and nonces.
func TestPolySum(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	sizes := []int{0, 1, 15, 16, 17, 31, 32, 33, 100, 1000, 1024, 4097}
	for _, n := range []int{1 << 20, 2 << 20, 3<<20 + 5} {
		sizes = append(sizes, n-17, n-16, n-1, n, n+1, n+16, n+33)
	}
	for i, n := range sizes {
		key, nonce := randomPolyKey(rng)
		b := randomBytes(rng, n)
		want := polyReference(t, key, nonce, b)
		if got := PolySum(key, nonce, b); got != want {
			t.Fatalf("PolySum of %d bytes: %s, want %s", n, got, want)
		}
		w := []int{2, 3, 4, 16}[i%4]
		if got := polySum(key, nonce, b, w); got != want {
			t.Fatalf("%d bytes on %d goroutines: %s, want %s", n, w, got, want)
		}
		if got := PolySumParallel(key, nonce, b); got != want {
			t.Fatalf("PolySumParallel of %d bytes: %s, want %s", n, got, want)
		}
	}
}

// TestPolySumLarge compares the parallel sum with the reference on 1 GiB
// and 9 bytes, except under -short or the race detector.
func TestPolySumLarge(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("1 GiB: not under -short or the race detector")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	key, nonce := randomPolyKey(rng)
	b := randomBytes(rng, 1<<30+9)
	if got, want := PolySumParallel(key, nonce, b), polyReference(t, key, nonce, b); got != want {
		t.Fatalf("%s, want %s", got, want)
	}
}

// TestPolyStrided evaluates the polynomial as a GPU kernel's threads do,
// each over the blocks g, g+s, g+2s, ... of the message with r^s, raised
// at its end by the key's powers, and the values added limb by limb: the
// tag must be PolySum's.
func TestPolyStrided(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, tc := range []struct{ n, stride int }{{0, 4}, {5, 4}, {16, 1}, {100, 3}, {4096, 256}, {4097, 256}, {65536 + 7, 1000}, {1 << 20, 4096}} {
		key, nonce := randomPolyKey(rng)
		b := randomBytes(rng, tc.n)
		q := PolyBlocks(int64(tc.n))
		rs := key.Power(uint64(tc.stride))
		var sums [5]uint64
		for g := 0; g < tc.stride; g++ {
			var h Limbs
			last := uint64(0)
			for i := uint64(g); i < q; i += uint64(tc.stride) {
				h = h.mul(rs).add(polyBlock(b, i))
				last = i
			}
			if uint64(g) >= q {
				continue
			}
			h = h.mulPower(key, q-last)
			for j, l := range h {
				sums[j] += uint64(l)
			}
		}
		if got, want := key.Finish(nonce, sums), PolySum(key, nonce, b); got != want {
			t.Errorf("%d bytes, stride %d: %s, want %s", tc.n, tc.stride, got, want)
		}
	}
}

// polyBlock returns block i of message b in limbs, the last one padded.
func polyBlock(b []byte, i uint64) Limbs {
	lo := int(i) * PolyBlockSize
	if lo+PolyBlockSize <= len(b) {
		return limbsOf(b[lo:], 1)
	}
	var last [PolyBlockSize]byte
	copy(last[:], b[lo:])
	last[len(b)-lo] = 1
	return limbsOf(last[:], 0)
}

// TestLimbsMul checks mul against math/big at the bounds its comment
// gives (the GPU kernels' arithmetic): a's limbs up to 2^27 + 2^10, b's
// carried ones up to 2^26 (limb 1 up to 2^26 + 2^9), and random values;
// and that its results are carried as it says.
func TestLimbsMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	const aMax, bMax, b1Max = 1<<27 + 1<<10 - 1, 1<<26 - 1, 1<<26 + 1<<9 - 1
	cases := [][2]Limbs{
		{{aMax, aMax, aMax, aMax, aMax}, {bMax, b1Max, bMax, bMax, bMax}},
		{{aMax, aMax, aMax, aMax, aMax}, {0, 0, 0, 0, bMax}},
		{{0, 0, 0, 0, aMax}, {0, b1Max, 0, 0, 0}},
		{{1}, {1}},
	}
	for range 2000 {
		var a, b Limbs
		for j := range a {
			a[j] = rng.Uint32N(aMax + 1)
			b[j] = rng.Uint32N(bMax + 1)
		}
		b[1] = rng.Uint32N(b1Max + 1)
		cases = append(cases, [2]Limbs{a, b})
	}
	for _, c := range cases {
		got := c[0].mul(c[1])
		want := new(big.Int).Mul(limbsBig(c[0]), limbsBig(c[1]))
		want.Mod(want, polyP)
		if g := new(big.Int).Mod(limbsBig(got), polyP); g.Cmp(want) != 0 {
			t.Fatalf("%v · %v = %v (%s), want %s", c[0], c[1], got, g, want)
		}
		for j, l := range got {
			if bound := uint32(1 << 26); l >= bound && !(j == 1 && l <= b1Max) {
				t.Fatalf("%v · %v: limb %d is %#x, not carried", c[0], c[1], j, l)
			}
		}
		if r := got.reduce(); limbsBig(r).Cmp(want) != 0 {
			t.Fatalf("reduce(%v) = %v, want %s", got, r, want)
		}
	}
}

// TestPolyFinish checks that Finish takes limb sums of any size below
// 2^63.
func TestPolyFinish(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	key, nonce := randomPolyKey(rng)
	for _, s := range [][5]uint64{
		{},
		{1<<63 - 1, 1<<63 - 1, 1<<63 - 1, 1<<63 - 1, 1<<63 - 1},
		{0, 0, 0, 0, 1 << 63},
		{limbMask, limbMask, limbMask, limbMask, limbMask}, // 2^130 - 1
		{limbMask - 4, limbMask, limbMask, limbMask, limbMask},
		{rng.Uint64() >> 1, rng.Uint64() >> 1, rng.Uint64() >> 1, rng.Uint64() >> 1, rng.Uint64() >> 1},
	} {
		v := new(big.Int)
		for j := 4; j >= 0; j-- {
			v.Lsh(v, 26).Add(v, new(big.Int).SetUint64(s[j]))
		}
		v.Mod(v, polyP)
		var h Limbs
		for j := range h {
			h[j] = uint32(new(big.Int).Rsh(v, uint(26*j)).Uint64() & limbMask)
		}
		if got, want := key.Finish(nonce, s), key.finish(nonce, h); got != want {
			t.Errorf("sums %x: %s, want %s", s, got, want)
		}
		if r := carrySums(s); limbsBig(r).Cmp(v) != 0 {
			t.Errorf("sums %x carry to %s, want %s", s, limbsBig(r), v)
		}
	}
}

// TestPolyPower checks Power against math/big.
func TestPolyPower(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	key, _ := randomPolyKey(rng)
	r := limbsBig(key.R())
	for _, e := range []uint64{0, 1, 2, 3, 255, 256, 1 << 20, 1<<32 - 1, rng.Uint64N(1 << PolyPowers)} {
		want := new(big.Int).Exp(r, new(big.Int).SetUint64(e), polyP)
		if got := limbsBig(key.Power(e)); got.Cmp(want) != 0 {
			t.Errorf("r^%d = %s, want %s", e, got, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("Power(2^PolyPowers) did not panic")
		}
	}()
	key.Power(1 << PolyPowers)
}

// TestPolyKeyClamp checks that NewPolyKey clamps r as Poly1305 defines.
func TestPolyKeyClamp(t *testing.T) {
	var kb [PolyKeySize]byte
	for i := range kb {
		kb[i] = 0xff
	}
	b := NewPolyKey(&kb).Bytes()
	if got, want := hex.EncodeToString(b[16:]), "ffffff0ffcffff0ffcffff0ffcffff0f"; got != want {
		t.Errorf("r %s, want %s", got, want)
	}
	if hex.EncodeToString(b[:16]) != "ffffffffffffffffffffffffffffffff" {
		t.Errorf("k changed: %x", b[:16])
	}
}

func TestPolyTag(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	key, nonce := randomPolyKey(rng)
	a := PolySum(key, nonce, []byte("bucket"))
	if !a.Equal(a) {
		t.Error("a tag differs from itself")
	}
	for i := range PolyTagSize {
		c := a
		c[i] ^= 1
		if a.Equal(c) {
			t.Errorf("tags differing in byte %d are Equal", i)
		}
	}
	other := *nonce
	other[0] ^= 1
	if PolySum(key, &other, []byte("bucket")) == a {
		t.Error("two nonces gave one tag")
	}
}

func TestPolyNonceAndKind(t *testing.T) {
	a, b := RandomNonce(), RandomNonce()
	if a == b || a == (Nonce{}) {
		t.Errorf("two random nonces: %s, %s", a, b)
	}
	tag := PolyTag{1, 2, 15: 3}
	w := tag.AsTag()
	if [16]byte(w[:16]) != [16]byte(tag) || [16]byte(w[16:]) != [16]byte{} {
		t.Errorf("AsTag: %s", w)
	}
	for s, want := range map[string]Kind{"": BLAKE3, "blake3": BLAKE3, "poly1305-aes": Poly1305AES} {
		if k, err := ParseKind(s); err != nil || k != want {
			t.Errorf("ParseKind(%q) = %q, %v", s, k, err)
		}
	}
	if _, err := ParseKind("hmac"); err == nil || !strings.Contains(err.Error(), `"poly1305-aes"`) {
		t.Errorf("ParseKind(hmac): %v", err)
	}
}

// TestPolyExtremes compares PolySum with the reference where its words
// are at their bounds: r and every message byte at their largest (all
// ones, r clamped), and all zeros, at lengths around blocks and pieces.
func TestPolyExtremes(t *testing.T) {
	var ones [PolyKeySize]byte
	for i := range ones {
		ones[i] = 0xff
	}
	key, nonce := NewPolyKey(&ones), &Nonce{}
	for _, fill := range []byte{0xff, 0} {
		for _, n := range []int{1, 15, 16, 17, 4096, 1<<20 - 1, 1 << 20, 3<<20 + 1} {
			b := bytes.Repeat([]byte{fill}, n)
			want := polyReference(t, key, nonce, b)
			if got := PolySum(key, nonce, b); got != want {
				t.Fatalf("%d bytes of %#x: %s, want %s", n, fill, got, want)
			}
			if got := polySum(key, nonce, b, 3); got != want {
				t.Fatalf("%d bytes of %#x on 3 goroutines: %s, want %s", n, fill, got, want)
			}
		}
	}
}
