package gpu

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/weightcast/weightcast/mac"
	"lukechampine.com/blake3/guts"
)

// The tests below run the generated mac_chunks.ptx and mac_parents.ptx on
// the host, through the PTX interpreter of ptx_interp_test.go, launched as
// MACer launches them (macPlan), and compare with mac.Sum bit for bit. The
// input is mapped read-only and exactly n bytes long, so a read of any byte
// at or past n fails the test; the chaining values are a region of exactly
// 32 bytes per chunk, the output one of 32 bytes.

const (
	ptxMACBufBase = 0x7f0000000000
	ptxMACCVBase  = 0x7f1000000000
	ptxMACOutBase = 0x7f2000000000
)

func macPTXKernels(t *testing.T) (chunks, parents *ptxKernel) {
	t.Helper()
	chunks = parsePTX(t, "mac_chunks.ptx", macChunksPTX)
	if chunks.name != "wc_mac_chunks" || len(chunks.params) != 8 {
		t.Fatalf("kernel %s(%v): want wc_mac_chunks(buf, n, key01, key23, key45, key67, cvs, out)", chunks.name, chunks.params)
	}
	parents = parsePTX(t, "mac_parents.ptx", macParentsPTX)
	if parents.name != "wc_mac_parents" || len(parents.params) != 9 || parents.paramSize[2] != 4 || parents.paramSize[3] != 4 {
		t.Fatalf("kernel %s(%v): want wc_mac_parents(cvs, m, u32 shift, u32 levels, key01, key23, key45, key67, out)", parents.name, parents.params)
	}
	return chunks, parents
}

// runMACPTX computes the MAC of buf, mapped at ptxMACBufBase+off, with
// blocks of threads threads and parent launches of at most levels levels.
// When only is not nil, the chunk kernel runs blocks of one thread and only
// for the chunks listed: the chaining values of the others (which must be
// whole chunks) are computed on the host, with lukechampine.com/blake3's
// compression, so that a test covers large trees at little cost.
func runMACPTX(t *testing.T, chunksK, parentsK *ptxKernel, key *mac.Key, buf []byte, off uint64, threads, levels int, only []int) mac.Tag {
	t.Helper()
	chunks := uint64(max(1, (len(buf)+mac.ChunkSize-1)/mac.ChunkSize))
	cvs := make([]byte, 32*chunks)
	out := make([]byte, 32)
	if only != nil {
		threads = 1
		kw := key.Words()
		for i := range chunks {
			if !slices.Contains(only, int(i)) {
				putCV(cvs[32*i:], guts.ChainingValue(guts.CompressChunk(buf[i*mac.ChunkSize:(i+1)*mac.ChunkSize], &kw, i, guts.FlagKeyedHash)))
			}
		}
	}
	mem := &ptxMemory{}
	mem.addRegion(ptxMACBufBase+off, buf, true, "input")
	mem.add(ptxMACCVBase, cvs)
	mem.add(ptxMACOutBase, out)
	k := macKeyParams(key)
	grid := func(n uint64) int { return int((n + uint64(threads) - 1) / uint64(threads)) }
	if err := chunksK.runBlocks(mem, grid(chunks), threads, only, ptxMACBufBase+off, uint64(len(buf)), k[0], k[1], k[2], k[3], ptxMACCVBase, ptxMACOutBase); err != nil {
		t.Fatalf("%d bytes at offset %d: chunk kernel: %v", len(buf), off, err)
	}
	for i, l := range macPlan(chunks, levels) {
		if err := parentsK.run(mem, grid(l.threads), threads, ptxMACCVBase, l.m, uint64(l.shift), uint64(l.levels), k[0], k[1], k[2], k[3], ptxMACOutBase); err != nil {
			t.Fatalf("%d bytes: parent launch %d (%+v): %v", len(buf), i, l, err)
		}
	}
	return mac.Tag(out)
}

// putCV writes a chaining value as the kernels store it, little-endian.
func putCV(b []byte, cv [8]uint32) {
	for i, w := range cv {
		binary.LittleEndian.PutUint32(b[4*i:], w)
	}
}

// randomMACCase returns a random key and n random bytes.
func randomMACCase(rng *rand.Rand, n int) (*mac.Key, []byte) {
	var key mac.Key
	for j := range key {
		key[j] = byte(rng.Uint32())
	}
	buf := make([]byte, n)
	for j := range buf {
		buf[j] = byte(rng.Uint32())
	}
	return &key, buf
}

// lastChunk returns a size of c chunks whose last chunk is, in turn, whole,
// one byte, one block and a byte, or of a random size.
func lastChunk(rng *rand.Rand, c int) int {
	base := (c - 1) * mac.ChunkSize
	return base + []int{mac.ChunkSize, 1, 65, 1 + rng.IntN(mac.ChunkSize)}[c%4]
}

// TestMACPTX compares the kernels, run on every chunk, with mac.Sum: 0 to
// 130 bytes, 1 to 20 chunks and 64 and 65 chunks, with last chunks of
// every kind (lastChunk), some at unaligned addresses (whose blocks are
// read a byte at a time), under random keys, blocks of 1 to 64 threads and
// parent launches of 1 to 5 levels.
func TestMACPTX(t *testing.T) {
	chunksK, parentsK := macPTXKernels(t)
	rng := rand.New(rand.NewPCG(21, 22))
	var sizes []int
	for n := 0; n <= 130; n += 1 + n/16 {
		sizes = append(sizes, n)
	}
	for c := 1; c <= 20; c++ {
		sizes = append(sizes, lastChunk(rng, c))
	}
	sizes = append(sizes, 64*mac.ChunkSize, 64*mac.ChunkSize+1)
	threads := []int{1, 32, 7, 64, 3}
	for i, n := range sizes {
		key, buf := randomMACCase(rng, n)
		off := uint64(0)
		if i%7 == 4 {
			off = uint64(1 + rng.IntN(15))
		}
		levels := 1 + i%5
		want := mac.Sum(key, buf)
		if got := runMACPTX(t, chunksK, parentsK, key, buf, off, threads[i%len(threads)], levels, nil); got != want {
			t.Fatalf("%d bytes at offset %d, parent launches of %d levels: kernels give %s, mac.Sum %s", n, off, levels, got, want)
		}
	}
}

// TestMACPTXTreeShapes compares the kernels with mac.Sum on every tree
// shape from 1 to 80 chunks and on larger ones around powers of two (to
// 1025 chunks), each with a last chunk of another kind, under parent
// launches of 1 to 5 levels: the parent kernel runs over the whole tree,
// the chunk kernel on the first two, the last two and one random chunk
// (the others' chaining values come from the host; see runMACPTX).
func TestMACPTXTreeShapes(t *testing.T) {
	skipUnderRace(t)
	chunksK, parentsK := macPTXKernels(t)
	rng := rand.New(rand.NewPCG(23, 24))
	var counts []int
	for c := 1; c <= 80; c++ {
		counts = append(counts, c)
	}
	counts = append(counts, 127, 128, 129, 255, 256, 257, 1025)
	for i, c := range counts {
		n := lastChunk(rng, c)
		key, buf := randomMACCase(rng, n)
		only := []int{0, c - 1, rng.IntN(c)}
		if c > 2 {
			only = append(only, 1, c-2)
		}
		slices.Sort(only)
		only = slices.Compact(only)
		levels := 1 + i%5
		want := mac.Sum(key, buf)
		if got := runMACPTX(t, chunksK, parentsK, key, buf, 0, 1, levels, only); got != want {
			t.Fatalf("%d chunks (%d bytes), parent launches of %d levels: kernels give %s, mac.Sum %s", c, n, levels, got, want)
		}
	}
}

// TestMACPTXHighCounter runs the chunk kernel on the last block of a
// virtual input of 2^32 + 301 chunks (4 TiB; only the block's 45 chunks are
// mapped), where chunk counters need their high word, and compares its
// chaining values with lukechampine.com/blake3's compression.
func TestMACPTXHighCounter(t *testing.T) {
	chunksK, _ := macPTXKernels(t)
	const (
		threads = 64
		first   = 1<<32 + 256 // the block's first chunk
		chunks  = 1<<32 + 301
		n       = (chunks-1)*mac.ChunkSize + 17
		bufBase = 0x100000000000
	)
	key, part := randomMACCase(rand.New(rand.NewPCG(25, 26)), n-first*mac.ChunkSize)
	cvs := make([]byte, 32*(chunks-first))
	mem := &ptxMemory{}
	mem.addRegion(bufBase+first*mac.ChunkSize, part, true, "the input's last block of chunks")
	mem.add(ptxMACCVBase+32*first, cvs)
	k := macKeyParams(key)
	grid := (chunks + threads - 1) / threads
	if err := chunksK.runBlocks(mem, grid, threads, []int{first / threads}, bufBase, n, k[0], k[1], k[2], k[3], ptxMACCVBase, ptxMACOutBase); err != nil {
		t.Fatal(err)
	}
	kw := key.Words()
	for i := range chunks - first {
		want := make([]byte, 32)
		end := min((i+1)*mac.ChunkSize, len(part))
		putCV(want, guts.ChainingValue(guts.CompressChunk(part[i*mac.ChunkSize:end], &kw, first+uint64(i), guts.FlagKeyedHash)))
		if got := cvs[32*i : 32*i+32]; !bytes.Equal(got, want) {
			t.Fatalf("chunk %d: chaining value %x, want %x", first+i, got, want)
		}
	}
}

// TestMACPTXLoads checks which loads the chunk kernel uses: four 16-byte
// loads per whole block of a 16-byte aligned input, bytes only for the
// bytes of a partial last block, and bytes throughout when the input is
// not 16-byte aligned.
func TestMACPTXLoads(t *testing.T) {
	chunksK, parentsK := macPTXKernels(t)
	key := mac.Key([]byte("whats the Elvish word for friend"))
	for _, n := range []int{0, 1, 64, 100, 1024, 1088, 3000} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(i % 251)
		}
		for _, off := range []uint64{0, 4} {
			chunksK.resetCounts()
			if got, want := runMACPTX(t, chunksK, parentsK, &key, buf, off, 32, 3, nil), mac.Sum(&key, buf); got != want {
				t.Fatalf("%d bytes at offset %d: %s, want %s", n, off, got, want)
			}
			v4, u8 := 4*(n/64), n%64
			if off != 0 {
				v4, u8 = 0, n
			}
			if got := [2]int{chunksK.executed("ld.global.v4.u32"), chunksK.executed("ld.global.u8")}; got != [2]int{v4, u8} {
				t.Errorf("%d bytes at offset %d: %d 16-byte and %d byte loads, want %d and %d", n, off, got[0], got[1], v4, u8)
			}
		}
	}
}

// TestMACPlan checks the parent launches: each starts where the last
// ended, joins at most the levels asked for with one thread per 2^levels
// nodes, and the last leaves one node, the root.
func TestMACPlan(t *testing.T) {
	for _, chunks := range []uint64{1, 2, 3, 4, 5, 8, 9, 63, 64, 65, 1000, 1 << 20, 1<<20 + 1} {
		for _, most := range []int{1, 2, 3, 5} {
			plan := macPlan(chunks, most)
			m, shift := chunks, 0
			for _, l := range plan {
				if l.m != m || l.shift != shift || l.levels < 1 || l.levels > most || l.threads != (m+1<<l.levels-1)>>l.levels {
					t.Fatalf("%d chunks, at most %d levels: launch %+v after m=%d, shift=%d", chunks, most, l, m, shift)
				}
				m, shift = l.threads, shift+l.levels
			}
			if m != 1 || (chunks == 1) != (len(plan) == 0) {
				t.Fatalf("%d chunks, at most %d levels: %d launches leave %d nodes", chunks, most, len(plan), m)
			}
		}
	}
}

// TestMACKeyParams checks how the key reaches the kernels: word 2i in the
// low half of parameter i, word 2i+1 in the high half.
func TestMACKeyParams(t *testing.T) {
	var key mac.Key
	for i := range key {
		key[i] = byte(i)
	}
	p := macKeyParams(&key)
	w := key.Words()
	for i := range 4 {
		if p[i] != uint64(w[2*i])|uint64(w[2*i+1])<<32 || p[i] != binary.LittleEndian.Uint64(key[8*i:]) {
			t.Fatalf("parameter %d is %#x", i, p[i])
		}
	}
}

// TestMACCheckCases runs the device self-test's MACs (macCheck) through
// the kernels in the interpreter, whole, as the device runs them.
func TestMACCheckCases(t *testing.T) {
	chunksK, parentsK := macPTXKernels(t)
	pat := make([]byte, macCheckSize)
	for i := range pat {
		pat[i] = byte(i*167 + i>>10 + 5)
	}
	for _, c := range macCheck {
		buf := pat[c.off : c.off+c.n]
		var only []int
		if c.n > 70*mac.ChunkSize {
			// The interpreter runs the first and last chunks of the large
			// ones (see runMACPTX), which are 16-byte aligned or not as
			// the device sees them.
			last := (c.n - 1) / mac.ChunkSize
			only = []int{0, 1, last - 1, last}
		}
		if got, want := runMACPTX(t, chunksK, parentsK, &macCheckKey, buf, uint64(c.off), macThreads, macParentLevels, only), mac.Sum(&macCheckKey, buf); got != want {
			t.Fatalf("%d bytes at offset %d: %s, want %s", c.n, c.off, got, want)
		}
	}
}
