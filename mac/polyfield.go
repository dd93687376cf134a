package mac

import "encoding/binary"

// Limbs is a number modulo 2^130 - 5 as five 26-bit limbs, the lowest
// first: Σ l[j]·2^(26j). The GPU's Poly1305 kernels compute in this form
// (their 32×32-bit multiplies with 64-bit sums have the room it needs),
// and so do this package's steps that mirror theirs (Limbs.mul, the
// powers of r, Finish), so that the kernels' arithmetic has a reference;
// its own Horner loop runs in 64-bit words (PolyKey.horner). A limb may
// exceed 26 bits between steps; Limbs.mul's bounds below say by how much.
type Limbs [5]uint32

const limbMask = 1<<26 - 1

// limbsOf reads the 16 bytes at b's start (little-endian) as a number,
// adding 2^128 when hibit is 1 (Poly1305's full blocks).
func limbsOf(b []byte, hibit uint32) Limbs {
	m0 := binary.LittleEndian.Uint32(b[0:])
	m1 := binary.LittleEndian.Uint32(b[4:])
	m2 := binary.LittleEndian.Uint32(b[8:])
	m3 := binary.LittleEndian.Uint32(b[12:])
	return Limbs{
		m0 & limbMask,
		(m0>>26 | m1<<6) & limbMask,
		(m1>>20 | m2<<12) & limbMask,
		(m2>>14 | m3<<18) & limbMask,
		m3>>8 | hibit<<24,
	}
}

// add returns a + b limb by limb, without carries.
func (a Limbs) add(b Limbs) Limbs {
	for j := range a {
		a[j] += b[j]
	}
	return a
}

// mul returns a·b modulo 2^130 - 5 with its limbs carried: each below
// 2^26 but limb 1, below 2^26 + 2^9. It needs a's limbs below 2^27 + 2^10
// (a carried value plus a block) and b's carried. Then every product is
// below 2^27.01 · 5·2^26.01, every sum of five below 2^58, the carry out
// of limb 4 below 2^32.1, and limb 0 plus five times it below 2^34.5.
func (a Limbs) mul(b Limbs) Limbs {
	a0, a1, a2, a3, a4 := uint64(a[0]), uint64(a[1]), uint64(a[2]), uint64(a[3]), uint64(a[4])
	b0, b1, b2, b3, b4 := uint64(b[0]), uint64(b[1]), uint64(b[2]), uint64(b[3]), uint64(b[4])
	s1, s2, s3, s4 := 5*b1, 5*b2, 5*b3, 5*b4
	return carry([5]uint64{
		a0*b0 + a1*s4 + a2*s3 + a3*s2 + a4*s1,
		a0*b1 + a1*b0 + a2*s4 + a3*s3 + a4*s2,
		a0*b2 + a1*b1 + a2*b0 + a3*s4 + a4*s3,
		a0*b3 + a1*b2 + a2*b1 + a3*b0 + a4*s4,
		a0*b4 + a1*b3 + a2*b2 + a3*b1 + a4*b0,
	})
}

// carry carries the products' sums d into limbs, once around (2^130 ≡ 5):
// the GPU kernels' steps, in their order.
func carry(d [5]uint64) Limbs {
	var h Limbs
	for j := range 4 {
		d[j+1] += d[j] >> 26
		h[j] = uint32(d[j] & limbMask)
	}
	h[4] = uint32(d[4] & limbMask)
	h0 := uint64(h[0]) + 5*(d[4]>>26)
	h[0] = uint32(h0 & limbMask)
	h[1] += uint32(h0 >> 26)
	return h
}

// mulPower returns h·r^e by the key's powers: h times r^(2^j) for each
// bit j set in e; h itself when e is 0.
func (h Limbs) mulPower(k *PolyKey, e uint64) Limbs {
	for j := 0; e != 0; j, e = j+1, e>>1 {
		if e&1 != 0 {
			h = h.mul(k.pow[j])
		}
	}
	return h
}

// carrySums carries limb sums below 2^63 into a number modulo 2^130 - 5,
// fully reduced.
func carrySums(s [5]uint64) Limbs { return reduced(s) }

// reduce returns h modulo 2^130 - 5, fully reduced: limbs below 2^26 and
// the number below 2^130 - 5.
func (h Limbs) reduce() Limbs {
	var s [5]uint64
	for j := range s {
		s[j] = uint64(h[j])
	}
	return reduced(s)
}

// reduced returns Σ s[j]·2^(26j) modulo 2^130 - 5, fully reduced; each
// s[j] must be below 2^63, so that no carry overflows.
func reduced(s [5]uint64) Limbs {
	// Carry up the limbs, limb 4's carry going to limb 0 times five
	// (2^130 ≡ 5), until limb 0 takes none: then every limb is below
	// 2^26 and the number below 2^130. Each round shrinks what is carried
	// around, so few rounds are needed (at most 3 for any sums).
	for {
		for j := range 4 {
			s[j+1] += s[j] >> 26
			s[j] &= limbMask
		}
		c := s[4] >> 26
		s[4] &= limbMask
		s[0] += 5 * c
		if s[0] <= limbMask {
			break
		}
	}
	// h - p = h + 5 - 2^130 is the result when h ≥ p.
	var g [5]uint64
	c := uint64(5)
	for j := range g {
		g[j] = s[j] + c
		c = g[j] >> 26
		g[j] &= limbMask
	}
	if c != 0 { // h + 5 ≥ 2^130
		s = g
	}
	var h Limbs
	for j := range h {
		h[j] = uint32(s[j])
	}
	return h
}
