package gpu

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// The tests below run the embedded gather.ptx on the host, through the
// PTX interpreter of ptx_interp_test.go. The PTX compiler's own checks
// happen on a GPU only (TestGatherGPU, and the self-test each device runs
// before using it).

// TestGatherPTX parses the embedded kernel and runs it on random copies
// (runGatherPTX) in small descriptor slots and pieces of 16 KiB (so that
// copies span several pieces).
func TestGatherPTX(t *testing.T) {
	k := gatherPTXKernel(t, "gather.ptx", gatherPTX)
	rng := rand.New(rand.NewPCG(1, 2))
	runGatherPTX(t, k, rng, 1<<20, 16<<10, 50, []int{32, 64, 256})
	// A grid larger than count leaves the extra blocks idle.
	mem := &ptxMemory{}
	mem.add(ptxGatherDescBase, make([]byte, 24))
	if err := k.run(mem, 4, 32, ptxGatherDescBase, 0); err != nil {
		t.Fatalf("blocks past count: %v", err)
	}
}

// TestGatherVariantsPTX runs each variant of the gather kernels that the
// benchmarks compare (gatherVariants), plain and fused, in the
// interpreter, on random copies and on long aligned ones (many rounds of
// the unrolled and pipelined loops), and checks that every instruction
// of each ran, so that a benchmark measures only kernels that copy and
// sum right.
func TestGatherVariantsPTX(t *testing.T) {
	skipUnderRace(t)
	rng := rand.New(rand.NewPCG(3, 4))
	long := [][3]int{{0, 0, 70000}, {70016, 70032, 49987}}
	for _, v := range gatherVariants {
		plain, fused := v, v
		plain.sum, fused.sum = false, true
		k := gatherPTXKernel(t, "gather.ptx "+v.String(), plain.ptx())
		runGatherPTX(t, k, rng, 256<<10, 16<<10, 20, []int{32, 64})
		checkAllRan(t, k)
		k = gatherSumPTXKernelOf(t, "gather_sum.ptx "+v.String(), fused.ptx())
		for i := range 4 {
			runGatherSumPTX(t, k, rng, randomSumLayout(rng, SumSide(i%2), 20000+rng.IntN(20000), 16<<10), 16<<10, 7, []int{32, 64}[i/2])
			runGatherSumPTX(t, k, rng, sumLayout{SumSide(i % 2), 120003, 120048, long}, 64<<10, 3, []int{32, 64}[i/2])
		}
		checkAllRan(t, k)
	}
}

// checkAllRan fails t if an instruction of k never ran.
func checkAllRan(t *testing.T, k *ptxKernel) {
	t.Helper()
	for i, c := range k.counts {
		if c == 0 {
			t.Errorf("%s: line %d (%s) never ran", k.file, k.insts[i].line, k.insts[i].op)
		}
	}
}

const ptxGatherSrcBase, ptxGatherDstBase, ptxGatherDescBase = 0x7f0000000000, 0x7f1000000000, 0x7f2000000000

// gatherPTXKernel parses a plain gather kernel (file names it).
func gatherPTXKernel(t *testing.T, file, src string) *ptxKernel {
	t.Helper()
	k := parsePTX(t, file, src)
	if k.name != "wc_gather" || len(k.params) != 2 || k.paramSize[0] != 8 || k.paramSize[1] != 4 {
		t.Fatalf("%s: kernel %s(%v): want wc_gather(u64 ranges, u32 count)", file, k.name, k.params)
	}
	return k
}

// runGatherPTX runs the plain gather kernel k on random copies (sizes 1
// byte to 150 KiB, random alignments) into a destination of size bytes,
// described exactly as Gather describes them to the GPU (slots of
// slotRanges ranges, pieces of chunk bytes), on blocks of each of threads
// in turn, and compares every byte of the destination.
func runGatherPTX(t *testing.T, k *ptxKernel, rng *rand.Rand, size, chunk, slotRanges int, threads []int) {
	t.Helper()
	src, dst := randomBytes(rng, size), make([]byte, size)
	want := make([]byte, size)
	var b CopyBatch
	for at := 0; ; {
		n := 1 + int(rng.ExpFloat64()*2000)
		if rng.IntN(8) == 0 {
			n = 1 + rng.IntN(150<<10)
		}
		if rng.IntN(2) == 0 {
			n = (n + 15) &^ 15
		}
		at = (at + rng.IntN(64)) &^ (map[bool]int{true: 15}[rng.IntN(2) == 0])
		if at+n > size {
			break
		}
		s := rng.IntN(size - n)
		if rng.IntN(2) == 0 {
			s &^= 15
		}
		b.Add(ptxGatherDstBase+uint64(at), ptxGatherSrcBase+uint64(s), int64(n))
		copy(want[at:at+n], src[s:s+n])
		at += n
	}
	words := make([]uint64, slotRanges*gatherWords)
	desc := make([]byte, len(words)*8)
	sp := rangeSplitter{b: &b, chunk: uint64(chunk)}
	launches := 0
	for !sp.done() {
		n := sp.fill(words)
		for i, w := range words[:n*gatherWords] {
			binary.LittleEndian.PutUint64(desc[8*i:], w)
		}
		mem := &ptxMemory{}
		mem.addRegion(ptxGatherSrcBase, src, true, "source")
		mem.add(ptxGatherDstBase, dst)
		mem.addRegion(ptxGatherDescBase, desc[:n*gatherWords*8], true, "ranges")
		// A few threads keep the interpreter fast; the loops do not care
		// how many there are.
		if err := k.run(mem, n, threads[launches%len(threads)], ptxGatherDescBase, uint64(n)); err != nil {
			t.Fatalf("%s: launch %d: %v", k.file, launches, err)
		}
		launches++
	}
	if i := diffAt(dst, want); i >= 0 {
		t.Fatalf("%s: %d copies of %d bytes, after %d launches: byte %d is %#x, want %#x", k.file, b.Len(), b.Bytes(), launches, i, dst[i], want[i])
	}
}

// TestRangeSplitter checks the descriptors Gather builds: every copy is
// covered exactly once, in pieces of at most the chunk size that start at
// multiples of it (so they keep the copy's alignment), resumable across
// slots of any size.
func TestRangeSplitter(t *testing.T) {
	var b CopyBatch
	sizes := []int64{1, 15, 16, 17, 4096, GatherChunk - 1, GatherChunk, GatherChunk + 1, 3<<20 + 5, 100}
	for i, n := range sizes {
		b.Add(uint64(1+i)<<40, uint64(1+i)<<32+uint64(i), n)
	}
	var want [][]uint64
	for i, n := range sizes {
		dst, src := uint64(1+i)<<40, uint64(1+i)<<32+uint64(i)
		for off := uint64(0); off < uint64(n); off += GatherChunk {
			want = append(want, []uint64{src + off, dst + off, min(GatherChunk, uint64(n)-off)})
		}
	}
	checkSplitter(t, gatherWords, want, func() descSource { return &rangeSplitter{b: &b, chunk: GatherChunk} })
	if GatherChunk%16 != 0 {
		t.Fatal("GatherChunk must keep 16-byte alignment")
	}
}

// TestGatherPiece checks the default pieces: about 1/gatherPieces of the
// bytes, multiples of 16, from gatherMinChunk to GatherChunk.
func TestGatherPiece(t *testing.T) {
	for bytes, want := range map[int64]uint64{
		0: gatherMinChunk, 1: gatherMinChunk, 16 << 20: gatherMinChunk, 64 << 20: 64 << 10,
		100<<20 + 3: 102400, 100<<20 + 2048: 102416, 256 << 20: 256 << 10, 1 << 30: GatherChunk, 1 << 40: GatherChunk,
	} {
		if got := gatherPiece(bytes); got != want {
			t.Errorf("gatherPiece(%d) = %d, want %d", bytes, got, want)
		}
	}
	if GatherChunk%16 != 0 || gatherMinChunk%16 != 0 || gatherMinChunk > GatherChunk {
		t.Fatal("the pieces must keep 16-byte alignment and their bounds their order")
	}
}

// TestGatherCheckCopies keeps the device self-test's copies apart and
// inside its buffers.
func TestGatherCheckCopies(t *testing.T) {
	const n = gatherCheckSize
	used := make([]bool, n)
	for _, c := range gatherCheck {
		if c.src+c.n > n || c.dst+c.n > n {
			t.Fatalf("%+v outside %d bytes", c, n)
		}
		for i := c.dst; i < c.dst+c.n; i++ {
			if used[i] {
				t.Fatalf("%+v overlaps an earlier copy", c)
			}
			used[i] = true
		}
	}
	if !bytes.Contains([]byte(gatherPTX), []byte(".entry wc_gather(")) {
		t.Fatal("gather.ptx has no wc_gather entry")
	}
}
