// Package mac computes the keyed MAC of a bucket's bytes: keyed BLAKE3 with
// a 32-byte key and a 32-byte output, a standard construction whose tree
// lets every 1 KiB chunk be compressed independently, so that a GPU kernel
// (gpu.MACer) computes the same value in parallel and this package is its
// reference.
//
// Sum computes it on the calling goroutine, SumParallel across cores; both
// give exactly BLAKE3's keyed_hash (checked against the official test
// vectors and two independent Go implementations). The compression
// function is lukechampine.com/blake3's (its guts package, with its AVX2
// and AVX-512 code); this package only schedules it over the tree:
//
//   - the input is cut into 1 KiB chunks (the last one 1 to 1024 bytes; an
//     empty input is one empty chunk), each compressed into a chaining
//     value with its index as the counter;
//   - chaining values combine pairwise, level by level, into parent nodes,
//     an odd last one carried up unchanged; equivalently, every left
//     subtree holds the largest power of two of chunks that leaves at
//     least one chunk to its right;
//   - the last node, a chunk when there is only one, is compressed with the
//     ROOT flag, and its first 32 bytes are the MAC.
//
// SumParallel splits the chunks before the last into aligned subtrees of a
// power-of-two number of chunks, computes their chaining values on up to
// GOMAXPROCS goroutines, and combines them in order, so the tree and the
// value are the same as Sum's.
//
// A MAC proves who wrote the bytes only to holders of the key: compare tags
// with Tag.Equal, which takes the same time wherever they differ.
package mac
