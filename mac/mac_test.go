package mac

import (
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"os"
	"testing"

	zeebo "github.com/zeebo/blake3"
	"lukechampine.com/blake3"
)

// testKey is the key of BLAKE3's official test vectors.
var testKey = Key([]byte("whats the Elvish word for friend"))

// vectorInput is the input of the official test vectors: 0, 1, ..., 250
// repeated.
func vectorInput(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// TestVectors checks Sum and SumParallel against the keyed_hash cases of
// BLAKE3's official test vectors (testdata/keyed_vectors.json).
func TestVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/keyed_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Key   string
		Cases []struct {
			InputLen  int    `json:"input_len"`
			KeyedHash string `json:"keyed_hash"`
		}
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if Key([]byte(v.Key)) != testKey || len(v.Cases) < 30 {
		t.Fatalf("key %q and %d cases: not the official vectors", v.Key, len(v.Cases))
	}
	for _, c := range v.Cases {
		want, err := hex.DecodeString(c.KeyedHash)
		if err != nil || len(want) < Size {
			t.Fatalf("input_len %d: bad keyed_hash %q", c.InputLen, c.KeyedHash)
		}
		in := vectorInput(c.InputLen)
		for _, w := range []int{1, 2, 3, 8} {
			if got := sum(&testKey, in, w); got != Tag(want) {
				t.Errorf("%d bytes on %d goroutines: %s, want %x", c.InputLen, w, got, want[:Size])
			}
		}
		if got := SumParallel(&testKey, in); got != Tag(want) {
			t.Errorf("SumParallel of %d bytes: %s, want %x", c.InputLen, got, want[:Size])
		}
	}
}

// reference returns the keyed BLAKE3 of b computed by two other Go
// implementations, failing t if they disagree.
func reference(t *testing.T, key *Key, b []byte) Tag {
	t.Helper()
	h := blake3.New(Size, key[:])
	h.Write(b)
	var a Tag
	copy(a[:], h.Sum(nil))
	z, err := zeebo.NewKeyed(key[:])
	if err != nil {
		t.Fatal(err)
	}
	z.Write(b)
	var c Tag
	copy(c[:], z.Sum(nil))
	if a != c {
		t.Fatalf("%d bytes: lukechampine.com/blake3 gives %s, github.com/zeebo/blake3 %s", len(b), a, c)
	}
	return a
}

// treeSizes returns input sizes that cover the tree's shapes: every
// chunk count from 1 to 70 with a full, a one-byte and a random partial
// last chunk, block edges within a chunk, and counts around the edges of
// SIMD groups and of powers of two.
func treeSizes(rng *rand.Rand) []int {
	sizes := []int{0, 1, 2, 63, 64, 65, 127, 128, 129, 1000}
	for c := 1; c <= 70; c++ {
		sizes = append(sizes, c*ChunkSize, (c-1)*ChunkSize+1, (c-1)*ChunkSize+1+rng.IntN(ChunkSize))
	}
	for _, c := range []int{127, 128, 129, 255, 256, 257, 1000, 1023, 1024, 1025, 2049} {
		sizes = append(sizes, c*ChunkSize, c*ChunkSize+1+rng.IntN(ChunkSize-1))
	}
	return sizes
}

// TestSumTreeShapes compares Sum and the parallel sum on 2 to 16
// goroutines with two other implementations over treeSizes, under random
// keys.
func TestSumTreeShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i, n := range treeSizes(rng) {
		var key Key
		for j := range key {
			key[j] = byte(rng.Uint32())
		}
		b := make([]byte, n)
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		want := reference(t, &key, b)
		if got := Sum(&key, b); got != want {
			t.Fatalf("Sum of %d bytes: %s, want %s", n, got, want)
		}
		w := []int{2, 3, 4, 5, 7, 16}[i%6]
		if got := sum(&key, b, w); got != want {
			t.Fatalf("%d bytes on %d goroutines: %s, want %s", n, w, got, want)
		}
	}
}

// TestSumParallelLarge compares the parallel sum with the references on
// inputs large enough for pieces of several sizes (64 MiB and odd counts
// of chunks, on 2 to 64 goroutines), and on 1 GiB and 517 bytes
// (2^20 + 1 chunks), except under -short or the race detector (whose
// shadow memory would multiply the 1 GiB).
func TestSumParallelLarge(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	sizes := []int{64 << 20, 3<<20 + 7*ChunkSize + 5, 33<<20 - 1}
	if !testing.Short() && !raceEnabled {
		sizes = append(sizes, 1<<30+517)
	}
	for _, n := range sizes {
		b := make([]byte, n)
		for j := 0; j < n; j += 8 {
			v := rng.Uint64()
			for k := j; k < min(j+8, n); k++ {
				b[k] = byte(v >> (8 * (k - j)))
			}
		}
		want := reference(t, &testKey, b)
		for _, w := range []int{2, 3, 8, 64} {
			if got := sum(&testKey, b, w); got != want {
				t.Fatalf("%d bytes on %d goroutines: %s, want %s", n, w, got, want)
			}
		}
		if got := SumParallel(&testKey, b); got != want {
			t.Fatalf("SumParallel of %d bytes: %s, want %s", n, got, want)
		}
		if n < 1<<30 {
			if got := Sum(&testKey, b); got != want {
				t.Fatalf("Sum of %d bytes: %s, want %s", n, got, want)
			}
		}
	}
}

// TestSubtrees checks SumParallel's pieces: they cover the chunks in
// order, each 2^height chunks starting at a multiple of 2^height, all but
// the remainder of the unit's size.
func TestSubtrees(t *testing.T) {
	for _, chunks := range []uint64{0, 1, 2, 3, 15, 16, 17, 100, 1023, 1 << 20, 1<<20 + 12345} {
		for _, w := range []int{1, 2, 3, 8, 64} {
			unit := groupHeight
			if w > 1 {
				unit = unitHeight(chunks, w)
			}
			at, whole := uint64(0), true
			for p := range subtrees(chunks, unit) {
				if p.first != at || p.first%(1<<p.height) != 0 || p.height > unit {
					t.Fatalf("%d chunks, unit 2^%d: piece %+v at chunk %d", chunks, unit, p, at)
				}
				if p.height < unit {
					whole = false
				} else if !whole {
					t.Fatalf("%d chunks: a whole unit after the remainder began", chunks)
				}
				at += 1 << p.height
			}
			if at != chunks {
				t.Fatalf("%d chunks, unit 2^%d: the pieces cover %d", chunks, unit, at)
			}
			if w > 1 && chunks/(1<<unit) > uint64(8*w) {
				t.Errorf("%d chunks on %d workers: %d pieces of 2^%d", chunks, w, chunks>>unit, unit)
			}
		}
	}
}

func TestTag(t *testing.T) {
	a := Sum(&testKey, nil)
	if a.String() != "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26" {
		t.Errorf("String: %s", a)
	}
	b := a
	if !a.Equal(b) {
		t.Error("a tag differs from itself")
	}
	for i := range Size {
		c := a
		c[i] ^= 0x80
		if a.Equal(c) {
			t.Errorf("tags differing in byte %d are Equal", i)
		}
	}
	if w := testKey.Words(); w[0] != 0x74616877 || w[7] != 0x646e6569 {
		t.Errorf("key words %08x", w)
	}
}
