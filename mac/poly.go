package mac

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
)

const (
	// PolyKeySize is the size of a Poly1305-AES key in bytes: the AES-128
	// key k, then r.
	PolyKeySize = 32
	// PolyTagSize is the size of a Poly1305-AES tag in bytes.
	PolyTagSize = 16
	// NonceSize is the size of a Poly1305-AES nonce in bytes.
	NonceSize = 16
	// PolyBlockSize is the size of Poly1305's message blocks: a message is
	// read as blocks of 16 bytes, the last one 1 to 16.
	PolyBlockSize = 16
	// PolyPowers is the number of powers r^(2^j), j < PolyPowers, that
	// PolyKey.Powers gives: enough for any exponent below 2^PolyPowers.
	PolyPowers = 32
)

// PolyKey is a Poly1305-AES key: k, an AES-128 key, and r, Poly1305's
// multiplier, clamped as Poly1305 requires (NewPolyKey clamps it).
// Poly1305-AES (D. J. Bernstein, "The Poly1305-AES message-authentication
// code", FSE 2005) tags message m under nonce n as
//
//	(Poly1305_r(m) + AES_k(n)) mod 2^128
//
// where Poly1305_r(m) is the polynomial of m's blocks evaluated at r
// modulo 2^130 - 5. It is secure as long as no two messages are tagged
// under one key and one nonce; a nonce drawn at random for every tag
// (RandomNonce) keeps that with overwhelming probability. A PolyKey does
// not change once made, and is safe for concurrent use.
type PolyKey struct {
	k     cipher.Block
	r     Limbs
	pow   [PolyPowers]Limbs // r^(2^j)
	bytes [PolyKeySize]byte
}

// NewPolyKey returns the key whose 32 bytes are k (16) then r (16); r's
// bits that Poly1305 requires to be zero are cleared.
func NewPolyKey(b *[PolyKeySize]byte) *PolyKey {
	k := &PolyKey{bytes: *b}
	clampR(k.bytes[16:])
	c, err := aes.NewCipher(k.bytes[:16])
	if err != nil {
		panic("mac: " + err.Error()) // unreachable: 16 bytes are an AES-128 key
	}
	k.k = c
	k.r = limbsOf(k.bytes[16:], 0)
	k.pow[0] = k.r
	for j := 1; j < PolyPowers; j++ {
		k.pow[j] = k.pow[j-1].mul(k.pow[j-1]).reduce()
	}
	return k
}

// clampR clears the bits of r (16 bytes, little-endian) that Poly1305's
// definition requires to be zero: the top four of bytes 3, 7, 11, 15 and
// the bottom two of bytes 4, 8, 12.
func clampR(r []byte) {
	for _, i := range []int{3, 7, 11, 15} {
		r[i] &= 15
	}
	for _, i := range []int{4, 8, 12} {
		r[i] &= 252
	}
}

// Bytes returns the key's 32 bytes, r clamped.
func (k *PolyKey) Bytes() [PolyKeySize]byte { return k.bytes }

// R returns r in limbs.
func (k *PolyKey) R() Limbs { return k.r }

// Powers returns r^(2^j) for j < PolyPowers, fully reduced: the table a
// GPU kernel raises its partial values with.
func (k *PolyKey) Powers() [PolyPowers]Limbs { return k.pow }

// Power returns r^e, fully reduced; e must be below 2^PolyPowers.
func (k *PolyKey) Power(e uint64) Limbs {
	if e>>PolyPowers != 0 {
		panic("mac: Poly1305 exponent past the key's table of powers")
	}
	p := Limbs{1}
	for j := 0; e != 0; j, e = j+1, e>>1 {
		if e&1 != 0 {
			p = p.mul(k.pow[j])
		}
	}
	return p.reduce()
}

// Nonce is a Poly1305-AES nonce: never used twice under one key.
type Nonce [NonceSize]byte

// RandomNonce returns a nonce drawn from crypto/rand: 128 random bits,
// so that two of the 2^32 tags a key might ever see share a nonce with
// probability below 2^-64.
func RandomNonce() Nonce {
	var n Nonce
	rand.Read(n[:]) // never fails (crypto/rand)
	return n
}

// String returns the nonce in hexadecimal.
func (n Nonce) String() string { return hex.EncodeToString(n[:]) }

// PolyTag is a Poly1305-AES tag.
type PolyTag [PolyTagSize]byte

// String returns the tag in hexadecimal.
func (t PolyTag) String() string { return hex.EncodeToString(t[:]) }

// Equal reports whether t and u are the same tag, in time that does not
// depend on where they differ.
func (t PolyTag) Equal(u PolyTag) bool { return subtle.ConstantTimeCompare(t[:], u[:]) == 1 }

// AsTag returns t in a Tag, where code that holds either MAC keeps it: t's
// 16 bytes, then 16 zeros.
func (t PolyTag) AsTag() Tag {
	var w Tag
	copy(w[:], t[:])
	return w
}

// PolySum returns the Poly1305-AES tag of b under key and nonce, computed
// on the calling goroutine.
func PolySum(key *PolyKey, nonce *Nonce, b []byte) PolyTag {
	return key.finish(nonce, key.segment(b, 0, PolyBlocks(int64(len(b)))))
}

// PolySumParallel returns PolySum(key, nonce, b), computing large inputs
// on up to GOMAXPROCS goroutines, all of which have returned when it
// returns.
func PolySumParallel(key *PolyKey, nonce *Nonce, b []byte) PolyTag {
	return polySum(key, nonce, b, runtime.GOMAXPROCS(0))
}

// polySum computes the tag on up to workers goroutines: b is cut into
// pieces of whole blocks, each evaluated on its own (PolyKey.segment), and
// their values added.
func polySum(key *PolyKey, nonce *Nonce, b []byte, workers int) PolyTag {
	q := PolyBlocks(int64(len(b)))
	if len(b) < parallelMin || workers <= 1 {
		return key.finish(nonce, key.segment(b, 0, q))
	}
	const piece = 1 << 20 // bytes, a multiple of PolyBlockSize
	pieces := (len(b) + piece - 1) / piece
	vals := make([]Limbs, pieces)
	var next atomic.Int64
	work := func() {
		for i := int(next.Add(1) - 1); i < pieces; i = int(next.Add(1) - 1) {
			lo := i * piece
			vals[i] = key.segment(b[lo:min(lo+piece, len(b))], uint64(lo/PolyBlockSize), q)
		}
	}
	var wg sync.WaitGroup
	for range min(workers, pieces) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	var sums [5]uint64
	for _, v := range vals {
		for j, l := range v {
			sums[j] += uint64(l)
		}
	}
	return key.Finish(nonce, sums)
}

// PolyBlocks returns the number of Poly1305 blocks of a message of n
// bytes.
func PolyBlocks(n int64) uint64 { return uint64((n + PolyBlockSize - 1) / PolyBlockSize) }

// segment returns the contribution of b, blocks first to first+len/16 of
// a message of q blocks, to the message's polynomial: Σ c_i·r^(q-i) over
// its blocks c_i, not fully reduced. Only the message's last block may be
// partial, so b's length is a multiple of 16 unless it ends the message.
func (k *PolyKey) segment(b []byte, first, q uint64) Limbs {
	full := len(b) / PolyBlockSize
	h := k.horner(b[:full*PolyBlockSize])
	if rest := b[full*PolyBlockSize:]; len(rest) > 0 {
		var last [PolyBlockSize]byte
		copy(last[:], rest)
		last[len(rest)] = 1
		h = h.add(limbsOf(last[:], 0)).mul(k.r)
		full++
	}
	// h = Σ c_i·r^(end-i) over the segment's blocks, end = first + full.
	return h.mulPower(k, q-first-uint64(full))
}

// horner returns Σ c_i·r^(n-i) over the n full blocks c_i of b (whose
// length is a multiple of 16): Poly1305's loop h = (h + c)·r, in 64-bit
// words on the CPU (twice the speed of the 26-bit limbs there), as limbs.
// h is kept as h0 + h1·2^64 + h2·2^128, below 2^130.2 after each step (h2
// at most 4, at most 7 once a block is added), and r, clamped, is r0 +
// r1·2^64 with both below 2^60, so that h2·r0 and h2·r1 fit in a word.
func (k *PolyKey) horner(b []byte) Limbs {
	r0 := binary.LittleEndian.Uint64(k.bytes[16:])
	r1 := binary.LittleEndian.Uint64(k.bytes[24:])
	var h0, h1, h2 uint64
	for ; len(b) >= PolyBlockSize; b = b[PolyBlockSize:] {
		var c uint64
		h0, c = bits.Add64(h0, binary.LittleEndian.Uint64(b[0:]), 0)
		h1, c = bits.Add64(h1, binary.LittleEndian.Uint64(b[8:]), c)
		h2 += c + 1 // and 2^128
		// The product in four words m0..m3, column by column.
		hi00, lo00 := bits.Mul64(h0, r0)
		hi01, lo01 := bits.Mul64(h0, r1)
		hi10, lo10 := bits.Mul64(h1, r0)
		hi11, lo11 := bits.Mul64(h1, r1)
		m0 := lo00
		m1, c1 := bits.Add64(hi00, lo01, 0)
		m1, c2 := bits.Add64(m1, lo10, 0)
		m2, c3 := bits.Add64(hi01, hi10, c1)
		m2, c4 := bits.Add64(m2, lo11, c2)
		m2, c5 := bits.Add64(m2, h2*r0, 0)
		m3 := hi11 + h2*r1 + c3 + c4 + c5
		// m = L + 2^130·H ≡ L + 4H + H (2^130 ≡ 5): L the low 130 bits,
		// 4H = m2 with its low 2 bits cleared, then m3, as two words.
		h0, h1, h2 = m0, m1, m2&3
		h0, c = bits.Add64(h0, m2&^3, 0)
		h1, c = bits.Add64(h1, m3, c)
		h2 += c
		h0, c = bits.Add64(h0, m2>>2|m3<<62, 0)
		h1, c = bits.Add64(h1, m3>>2, c)
		h2 += c
	}
	return Limbs{
		uint32(h0 & limbMask),
		uint32(h0 >> 26 & limbMask),
		uint32((h0>>52 | h1<<12) & limbMask),
		uint32(h1 >> 14 & limbMask),
		uint32(h1>>40 | h2<<24),
	}
}

// Finish returns the tag of the message whose polynomial is the sum of
// values given in limbs: sums[j] is the sum of the values' limb j (so a
// GPU kernel's threads can add their values limb by limb, without
// carries), each value reduced modulo 2^130 - 5 or not, each sum below
// 2^63.
func (k *PolyKey) Finish(nonce *Nonce, sums [5]uint64) PolyTag {
	return k.finish(nonce, carrySums(sums))
}

// finish returns the tag of the message whose polynomial is h: h plus
// AES_k(nonce), modulo 2^128.
func (k *PolyKey) finish(nonce *Nonce, h Limbs) PolyTag {
	var s [16]byte
	k.k.Encrypt(s[:], nonce[:])
	return addPad(h, &s)
}

// addPad returns (h mod 2^130 - 5) + s modulo 2^128, as 16 little-endian
// bytes: Poly1305's last step, s being the one-time pad.
func addPad(h Limbs, s *[16]byte) PolyTag {
	h = h.reduce()
	lo := uint64(h[0]) | uint64(h[1])<<26 | uint64(h[2])<<52
	hi := uint64(h[2])>>12 | uint64(h[3])<<14 | uint64(h[4])<<40
	s0, s1 := binary.LittleEndian.Uint64(s[:8]), binary.LittleEndian.Uint64(s[8:])
	lo, carry := add64(lo, s0)
	hi = hi + s1 + carry
	var t PolyTag
	binary.LittleEndian.PutUint64(t[:8], lo)
	binary.LittleEndian.PutUint64(t[8:], hi)
	return t
}

func add64(a, b uint64) (uint64, uint64) {
	s := a + b
	if s < a {
		return s, 1
	}
	return s, 0
}
