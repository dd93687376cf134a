// Package checksum computes the 64-bit bucket checksum that every receiver
// checks before it reads a bucket.
//
// The sum is built for parallel hardware: the bytes are read as
// little-endian 64-bit words (the tail zero-padded), word i contributes
// fmix64(w_i + (i+1)·φ), and the contributions are added modulo 2^64 with
// the length mixed in last. Addition is associative and commutative, so
// blocks can be summed independently (on several goroutines here, by a
// reduction kernel on a GPU) and combined; the index term makes word order
// matter, and since fmix64 is a bijection, changing any one word always
// changes the sum.
package checksum
