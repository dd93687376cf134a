// Package checksumtest forges bytes that keep their bucket checksum, for
// the tests that show what the checksum does not protect against: it is
// not keyed, and its words' contributions are independent, so whoever
// changes some words can solve one more word to give the same sum (only a
// keyed MAC, such as package mac's, stops that).
package checksumtest

import (
	"encoding/binary"

	"github.com/weightcast/weightcast/checksum"
)

// ForgedLen is how many bytes Forge changes: eight words it alters and one
// it solves.
const ForgedLen = 72

// Forge changes b's first 64 bytes (it flips every bit) and rewrites the
// next 8 so that the checksum of any input holding b at an offset that is
// a multiple of 8 keeps its value. first is the index of b's first word in
// that input (its offset / 8). b must hold at least ForgedLen bytes.
func Forge(b []byte, first uint64) {
	if len(b) < ForgedLen {
		panic("checksumtest: Forge needs 72 bytes")
	}
	word := func(j int) uint64 { return binary.LittleEndian.Uint64(b[8*j:]) }
	var before, after uint64
	for j := range 9 {
		before += checksum.Term(word(j), first+uint64(j))
	}
	for j := range 8 {
		binary.LittleEndian.PutUint64(b[8*j:], ^word(j))
		after += checksum.Term(word(j), first+uint64(j))
	}
	// The ninth word's term must make up the difference.
	w := unfmix64(before-after) - (first+9)*phi
	binary.LittleEndian.PutUint64(b[64:], w)
}

// phi is the checksum's index multiplier (package checksum's doc).
const phi = 0x9e3779b97f4a7c15

// unfmix64 inverts fmix64: each shift-xor by 33 is its own inverse on 64
// bits, and each odd multiplier has an inverse modulo 2^64.
func unfmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= inverse(0xc4ceb9fe1a85ec53)
	k ^= k >> 33
	k *= inverse(0xff51afd7ed558ccd)
	k ^= k >> 33
	return k
}

// inverse returns the inverse of odd c modulo 2^64 by Newton's iteration,
// each step doubling the correct low bits (c is its own inverse to 3 bits).
func inverse(c uint64) uint64 {
	x := c
	for range 5 {
		x *= 2 - c*x
	}
	return x
}
