package mac

import (
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"iter"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"lukechampine.com/blake3/guts"
)

const (
	// KeySize is the size of a key in bytes.
	KeySize = 32
	// Size is the size of a MAC in bytes.
	Size = 32
	// ChunkSize is the size of BLAKE3's chunks, the units its tree
	// compresses independently.
	ChunkSize = guts.ChunkSize
)

// Kind names a bucket MAC: what a group with a secret computes over a
// bucket's bytes.
type Kind string

const (
	// BLAKE3 is keyed BLAKE3 (Sum), the default.
	BLAKE3 Kind = "blake3"
	// Poly1305AES is Poly1305-AES (PolySum) under a random nonce per
	// bucket.
	Poly1305AES Kind = "poly1305-aes"
)

// Kinds lists the bucket MACs, the default first.
var Kinds = []Kind{BLAKE3, Poly1305AES}

// ParseKind returns the Kind named s ("" is BLAKE3), or an error that
// lists the names.
func ParseKind(s string) (Kind, error) {
	if s == "" {
		return BLAKE3, nil
	}
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("unknown bucket MAC %q: want %q or %q", s, BLAKE3, Poly1305AES)
}

// Key is a MAC key: 32 bytes, secret, derived for one run (see the
// security model in docs/operations.md).
type Key [KeySize]byte

// Tag is a MAC: the first 32 bytes of keyed BLAKE3's output.
type Tag [Size]byte

// String returns the tag in hexadecimal, as BLAKE3's test vectors write it.
func (t Tag) String() string { return hex.EncodeToString(t[:]) }

// Equal reports whether t and u are the same tag, in time that does not
// depend on where they differ.
func (t Tag) Equal(u Tag) bool { return subtle.ConstantTimeCompare(t[:], u[:]) == 1 }

// Words returns the key as BLAKE3 reads it: eight little-endian 32-bit
// words, the chaining value every chunk and parent starts from.
func (k *Key) Words() [8]uint32 {
	var w [8]uint32
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(k[4*i:])
	}
	return w
}

// Sum returns the keyed BLAKE3 of b under key, computed on the calling
// goroutine.
func Sum(key *Key, b []byte) Tag { return sum(key, b, 1) }

// parallelMin is the size below which SumParallel computes on the calling
// goroutine alone: starting goroutines costs more than it saves there.
const parallelMin = 1 << 20

// SumParallel returns Sum(key, b), computing large inputs on up to
// GOMAXPROCS goroutines, all of which have returned when it returns.
func SumParallel(key *Key, b []byte) Tag {
	workers := runtime.GOMAXPROCS(0)
	if len(b) < parallelMin {
		workers = 1
	}
	return sum(key, b, workers)
}

// group is the most chunks guts.CompressBuffer compresses at once (with
// SIMD across chunks), and groupHeight its height as a subtree.
const (
	group       = guts.MaxSIMD
	groupHeight = 4
	groupBytes  = group * ChunkSize
)

// subtree is a run of 2^height full chunks starting at chunk first: one
// piece of SumParallel's work, aligned in the tree (first is a multiple of
// 2^height), so its chaining value is a node of the tree.
type subtree struct {
	first  uint64
	height int
}

// sum computes the MAC of b on up to workers goroutines (the calling one
// and workers-1 more).
func sum(key *Key, b []byte, workers int) Tag {
	kw := key.Words()
	// The last chunk (1 to 1024 bytes; none for an empty input) is held
	// back: it ends the tree, and becomes the root when it is alone.
	chunks := uint64(max(1, (len(b)+ChunkSize-1)/ChunkSize))
	full := chunks - 1
	cv := func(p subtree) [8]uint32 {
		lo := p.first * ChunkSize
		return subtreeCV(b[lo:lo+ChunkSize<<p.height], &kw, p.first, p.height)
	}
	var t tree
	if workers <= 1 {
		for p := range subtrees(full, groupHeight) {
			t.push(cv(p), p.height, &kw)
		}
	} else {
		pieces := slices.Collect(subtrees(full, unitHeight(full, workers)))
		cvs := make([][8]uint32, len(pieces))
		var next atomic.Int64
		work := func() {
			for i := next.Add(1) - 1; i < int64(len(pieces)); i = next.Add(1) - 1 {
				cvs[i] = cv(pieces[i])
			}
		}
		var wg sync.WaitGroup
		for range min(workers, len(pieces)) - 1 {
			wg.Go(work)
		}
		work()
		wg.Wait()
		for i, p := range pieces {
			t.push(cvs[i], p.height, &kw)
		}
	}
	last := guts.CompressChunk(b[full*ChunkSize:], &kw, full, guts.FlagKeyedHash)
	root := t.root(last, &kw)
	root.Flags |= guts.FlagRoot
	out := guts.CompressNode(root)
	var tag Tag
	for i := range 8 {
		binary.LittleEndian.PutUint32(tag[4*i:], out[i])
	}
	return tag
}

// unitHeight returns the height of SumParallel's pieces of work over
// chunks chunks: about four pieces per worker, and at least a group, so
// that every piece compresses with SIMD.
func unitHeight(chunks uint64, workers int) int {
	if per := chunks / uint64(4*workers); per > group {
		return bits.Len64(per) - 1
	}
	return groupHeight
}

// subtrees cuts the first chunks chunks of an input into aligned subtrees,
// in order: of 2^unit chunks each, then the remainder as the subtrees
// BLAKE3's tree has there, of decreasing size.
func subtrees(chunks uint64, unit int) iter.Seq[subtree] {
	return func(yield func(subtree) bool) {
		at := uint64(0)
		for ; chunks-at >= 1<<unit; at += 1 << unit {
			if !yield(subtree{first: at, height: unit}) {
				return
			}
		}
		// Fewer than 2^unit chunks are left, starting at a multiple of
		// 2^unit: each power of two of their count is an aligned subtree.
		for rest := chunks - at; rest > 0; {
			h := bits.Len64(rest) - 1
			if !yield(subtree{first: at, height: h}) {
				return
			}
			at, rest = at+1<<h, rest-1<<h
		}
	}
}

// subtreeCV returns the chaining value of the 2^height full chunks of b,
// the first of which is chunk first of the input, on the calling
// goroutine.
func subtreeCV(b []byte, key *[8]uint32, first uint64, height int) [8]uint32 {
	const flags = guts.FlagKeyedHash
	switch {
	case height == 0:
		return guts.ChainingValue(guts.CompressChunk(b, key, first, flags))
	case height < groupHeight:
		// CompressBuffer reads a whole group's array.
		var buf [groupBytes]byte
		copy(buf[:], b)
		return guts.ChainingValue(guts.CompressBuffer(&buf, len(b), key, first, flags))
	}
	var t tree
	for off := 0; off < len(b); off += groupBytes {
		n := guts.CompressBuffer((*[groupBytes]byte)(b[off:]), groupBytes, key, first+uint64(off/ChunkSize), flags)
		t.push(guts.ChainingValue(n), groupHeight, key)
	}
	return t.cvs[height]
}

// tree is the part of a BLAKE3 tree built so far over the chunks pushed in
// order: the chaining values of its complete subtrees, at most one per
// height (cvs[h] holds one of 2^h chunks when bit h of chunks is set).
type tree struct {
	cvs    [64][8]uint32
	chunks uint64
}

// push adds the chaining value of the next subtree, of 2^height chunks
// (chunks must be a multiple of 2^height), merging equal-sized subtrees
// into parents as a binary counter carries.
func (t *tree) push(cv [8]uint32, height int, key *[8]uint32) {
	h := height
	for ; t.chunks&(1<<h) != 0; h++ {
		cv = guts.ChainingValue(guts.ParentNode(t.cvs[h], cv, key, guts.FlagKeyedHash))
	}
	t.cvs[h] = cv
	t.chunks += 1 << height
}

// root returns the tree's root node, not yet compressed, given its last
// node: the last node itself when the tree is empty, else the parents
// that join the subtrees, smallest first, to the last node.
func (t *tree) root(last guts.Node, key *[8]uint32) guts.Node {
	n := last
	for h := bits.TrailingZeros64(t.chunks); h < bits.Len64(t.chunks); h++ {
		if t.chunks&(1<<h) != 0 {
			n = guts.ParentNode(t.cvs[h], guts.ChainingValue(n), key, guts.FlagKeyedHash)
		}
	}
	return n
}
