package checksum

import (
	"encoding/binary"
	"runtime"
	"sync"
)

const phi = 0x9e3779b97f4a7c15

// fmix64 is MurmurHash3's 64-bit finalizer, a bijection with full avalanche.
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// Term returns word w's contribution to the sum at word index i:
// fmix64(w + (i+1)·φ).
func Term(w, i uint64) uint64 { return fmix64(w + (i+1)*phi) }

// partial sums the contributions of the words of b, whose first word has
// index first.
func partial(b []byte, first uint64) uint64 {
	var s uint64
	i := first
	for len(b) >= 32 {
		s += fmix64(binary.LittleEndian.Uint64(b) + (i+1)*phi)
		s += fmix64(binary.LittleEndian.Uint64(b[8:]) + (i+2)*phi)
		s += fmix64(binary.LittleEndian.Uint64(b[16:]) + (i+3)*phi)
		s += fmix64(binary.LittleEndian.Uint64(b[24:]) + (i+4)*phi)
		b, i = b[32:], i+4
	}
	for len(b) >= 8 {
		s += fmix64(binary.LittleEndian.Uint64(b) + (i+1)*phi)
		b, i = b[8:], i+1
	}
	if len(b) > 0 {
		var tail [8]byte
		copy(tail[:], b)
		s += fmix64(binary.LittleEndian.Uint64(tail[:]) + (i+1)*phi)
	}
	return s
}

// Sum returns the checksum of b on the calling goroutine.
func Sum(b []byte) uint64 {
	return Finish(partial(b, 0), int64(len(b)))
}

// Finish finishes a checksum of n bytes from sum, the sum modulo 2^64 of
// the contributions of its words, fmix64(w_i + (i+1)·φ) (see the package
// doc), as a parallel or GPU implementation computes it: in any grouping
// and any order. Finish(sum, n) is fmix64(sum ^ n); Sum(b) equals
// Finish of the sum of b's word contributions and len(b). n is an int64
// so that streams (Digest) and device buffers past 2 GiB finish the same
// way on every platform.
func Finish(sum uint64, n int64) uint64 {
	return fmix64(sum ^ uint64(n))
}

// parallelMin is the size above which SumParallel splits the work.
const parallelMin = 4 << 20

// SumParallel returns Sum(b), splitting large inputs across up to
// GOMAXPROCS goroutines, all of which have returned when it returns.
func SumParallel(b []byte) uint64 {
	workers := runtime.GOMAXPROCS(0)
	if len(b) < parallelMin || workers < 2 {
		return Sum(b)
	}
	// Split on 8-byte boundaries so word indices stay exact.
	per := (len(b)/workers + 7) &^ 7
	sums := make([]uint64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo := w * per
		if lo >= len(b) {
			break
		}
		hi := min(lo+per, len(b))
		wg.Go(func() { sums[w] = partial(b[lo:hi], uint64(lo/8)) })
	}
	wg.Wait()
	var s uint64
	for _, v := range sums {
		s += v
	}
	return Finish(s, int64(len(b)))
}

// Digest computes Sum over bytes written in pieces, in order.
// Its zero value is ready to use.
type Digest struct {
	sum  uint64
	n    uint64 // bytes written
	tail [8]byte
	nt   int // bytes pending in tail
}

// Write adds p to the digest. It never fails.
func (d *Digest) Write(p []byte) (int, error) {
	n := len(p)
	d.n += uint64(n)
	if d.nt > 0 {
		c := copy(d.tail[d.nt:], p)
		d.nt += c
		p = p[c:]
		if d.nt < 8 {
			return n, nil
		}
		d.sum += partial(d.tail[:], (d.n-uint64(len(p)))/8-1)
		d.nt = 0
	}
	whole := len(p) &^ 7
	first := (d.n - uint64(len(p))) / 8
	d.sum += partial(p[:whole], first)
	d.nt = copy(d.tail[:], p[whole:])
	return n, nil
}

// Sum64 returns the checksum of everything written so far.
func (d *Digest) Sum64() uint64 {
	s := d.sum
	if d.nt > 0 {
		s += partial(d.tail[:d.nt], (d.n-uint64(d.nt))/8)
	}
	return Finish(s, int64(d.n))
}
