package gpu

import (
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/checksum"
)

// The tests below run gather_layout.ptx on the host, through the PTX
// interpreter of ptx_interp_test.go, on ranges built by layoutSplitter as
// CopySumLayout builds them, and compare the bytes copied with the pieces
// and the sum with checksum.Sum of the layout built on the host. Sources
// are read-only and exactly as large as the pieces read from them need,
// so a read past a piece faults.

const (
	ptxLaySrcBase   = 0x7f4000000000 // where pieces are read
	ptxLayDstBase   = 0x7f5000000000 // where copied pieces go
	ptxLayDescBase  = 0x7f6000000000
	ptxLaySlotsBase = 0x7f7000000000
)

func gatherLayoutPTXKernel(t *testing.T) *ptxKernel {
	t.Helper()
	k := parsePTX(t, "gather_layout.ptx", gatherLayoutPTX)
	if k.name != "wc_gather_layout" || len(k.params) != 4 || k.paramSize[1] != 4 || k.paramSize[3] != 4 {
		t.Fatalf("kernel %s(%v): want wc_gather_layout(u64 ranges, u32 count, u64 slots, u32 first)", k.name, k.params)
	}
	return k
}

// layoutCase is a layout to test: pieces of an n-byte layout read from a
// source region of src bytes, each (source offset, position, size,
// destination offset or -1 for a piece only summed) into a destination
// region of dst bytes.
type layoutCase struct {
	n, src, dst int
	pieces      [][4]int
}

// randomLayout returns a layout of about size bytes as a bucket's entries
// are placed (mostly at multiples of 64, some on the next word, some
// after long runs of zeros), of 1 byte to past several chunks, their
// sources and destinations 16-byte aligned or not, some only summed, in
// order of position or shuffled.
func randomLayout(rng *rand.Rand, size, chunk int) layoutCase {
	var c layoutCase
	at, src, dst := 0, 0, 0
	if rng.IntN(3) == 0 {
		at = 8 * rng.IntN(100)
	}
	for {
		n := 1 + int(rng.ExpFloat64()*300)
		switch rng.IntN(8) {
		case 0:
			n = 1 + rng.IntN(3*chunk)
		case 1:
			n = 1 + rng.IntN(15)
		}
		if at+n > size {
			break
		}
		s := src + rng.IntN(40)
		if rng.IntN(2) == 0 {
			s = (s + 15) &^ 15
		}
		d := -1
		if rng.IntN(4) != 0 {
			d = dst + rng.IntN(40)
			if rng.IntN(2) == 0 {
				d = (d + 15) &^ 15
			}
			dst = d + n
		}
		c.pieces = append(c.pieces, [4]int{s, at, n, d})
		src = s + n
		end := at + n
		switch rng.IntN(5) {
		case 0:
			at = (end + 7) &^ 7
		case 1:
			at = (end + gatherLayoutExtend + 8*rng.IntN(200) + 7) &^ 7
		default:
			at = (end + 63) &^ 63
		}
	}
	c.n = min(size, at+rng.IntN(3)*rng.IntN(400))
	if k := len(c.pieces); k > 0 {
		if last := c.pieces[k-1]; c.n < last[1]+last[2] {
			c.n = last[1] + last[2]
		}
	}
	c.src, c.dst = src, dst+16
	if rng.IntN(4) == 0 {
		rng.Shuffle(len(c.pieces), func(i, j int) { c.pieces[i], c.pieces[j] = c.pieces[j], c.pieces[i] })
	}
	return c
}

// layout returns c as a Layout and the bytes the layout holds.
func (c layoutCase) layout(from []byte) (*Layout, []byte) {
	var l Layout
	want := make([]byte, c.n)
	for _, p := range c.pieces {
		var dst uint64
		if p[3] >= 0 {
			dst = ptxLayDstBase + uint64(p[3])
		}
		l.Add(int64(p[1]), ptxLaySrcBase+uint64(p[0]), int64(p[2]), dst)
		copy(want[p[1]:p[1]+p[2]], from[p[0]:p[0]+p[2]])
	}
	return &l, want
}

// runGatherLayoutPTX runs c through the kernel, in launches of at most
// slotRanges ranges of at most chunk bytes, on grids of at most blocks
// blocks of threads threads, from random bytes, and checks the bytes
// copied and the sum.
func runGatherLayoutPTX(t *testing.T, k *ptxKernel, rng *rand.Rand, c layoutCase, chunk, slotRanges, blocks, threads int) {
	t.Helper()
	from, to := make([]byte, max(c.src, 1)), make([]byte, max(c.dst, 1))
	for i := range from {
		from[i] = byte(rng.Uint32())
	}
	for i := range to {
		to[i] = byte(rng.Uint32())
	}
	wantTo := append([]byte(nil), to...)
	for _, p := range c.pieces {
		if p[3] >= 0 {
			copy(wantTo[p[3]:p[3]+p[2]], from[p[0]:p[0]+p[2]])
		}
	}
	l, layout := c.layout(from)
	sp, err := newLayoutSplitter(l, uint64(c.n), uint64(chunk))
	if err != nil {
		t.Fatal(err)
	}
	words := make([]uint64, slotRanges*gatherLayoutWords)
	desc := make([]byte, len(words)*8)
	slot := newPTXSumSlot()
	copy(slot[checksumResult:], "a result of an earlier sum, which the first launch replaces")
	launches := 0
	for !sp.done() {
		n := sp.fill(words)
		for i, w := range words[:n*gatherLayoutWords] {
			binary.LittleEndian.PutUint64(desc[8*i:], w)
		}
		mem := &ptxMemory{}
		mem.addRegion(ptxLaySrcBase, from, true, "sources")
		mem.addRegion(ptxLayDstBase, to, false, "destinations")
		mem.addRegion(ptxLayDescBase, desc[:n*gatherLayoutWords*8], true, "ranges")
		mem.add(ptxLaySlotsBase, slot)
		grid := min(n, blocks)
		if err := k.runBlocks(mem, grid, threads, rng.Perm(grid), ptxLayDescBase, uint64(n), ptxLaySlotsBase, ptxFirst(launches == 0)); err != nil {
			t.Fatalf("launch %d: %v", launches, err)
		}
		launches++
	}
	if i := diffAt(to, wantTo); i >= 0 {
		t.Fatalf("%d pieces: byte %d of the destinations is %#x, want %#x", len(c.pieces), i, to[i], wantTo[i])
	}
	if launches == 0 {
		clear(slot[checksumResult:]) // as Checksummer.queue does for a sum of no launch
	}
	if got, want := checksum.Finish(slot.result(t), int64(c.n)), checksum.Sum(layout); got != want {
		t.Fatalf("%d pieces, %d bytes, %d launches: the layout sum is %#x, checksum.Sum %#x", len(c.pieces), c.n, launches, got, want)
	}
}

// TestGatherLayoutPTX runs random layouts under small pieces and
// descriptor slots, grids smaller than the ranges (so that blocks stride
// over them) and blocks of 32 to 256 threads (whole warps, as the warps'
// reduction needs).
func TestGatherLayoutPTX(t *testing.T) {
	k := gatherLayoutPTXKernel(t)
	rng := rand.New(rand.NewPCG(41, 42))
	for i := range 16 {
		chunk := []int{1024, 4096, 256}[i%3]
		c := randomLayout(rng, 10000+rng.IntN(30000), chunk)
		threads := []int{32, 64, 96, 32}[i%4]
		if i == 9 {
			threads = 256
		}
		runGatherLayoutPTX(t, k, rng, c, chunk, 1+rng.IntN(60), 1+rng.IntN(8), threads)
	}
}

// TestGatherLayoutPTXEdges runs the layouts at the edges: no pieces (zeros
// alone), an empty layout, one byte, a piece ending in the layout's last
// partial word, runs of zeros of exactly gatherLayoutExtend and a word
// more, a misaligned source, pieces under 16 bytes, pieces only summed.
func TestGatherLayoutPTXEdges(t *testing.T) {
	k := gatherLayoutPTXKernel(t)
	rng := rand.New(rand.NewPCG(43, 44))
	for i, c := range []layoutCase{
		{5000, 0, 0, nil},
		{0, 0, 0, nil},
		{1, 16, 16, [][4]int{{0, 0, 1, 0}}},
		{1, 16, 16, [][4]int{{3, 0, 1, -1}}},
		{1003, 2000, 2000, [][4]int{{16, 0, 1003, 0}}},
		{1003, 2000, 2000, [][4]int{{16, 0, 997, 32}}},
		{1003, 2000, 2000, [][4]int{{5, 64, 939, 7}}},
		{4000, 4000, 4000, [][4]int{{0, 0, 100, 0}, {112, 104 + gatherLayoutExtend, 50, 112}, {200, 168 + 2*gatherLayoutExtend, 50, 200}}},
		{4000, 4000, 4000, [][4]int{{0, 0, 100, -1}, {112, 104 + gatherLayoutExtend, 50, -1}, {200, 168 + 2*gatherLayoutExtend, 50, -1}}},
		{600, 700, 700, [][4]int{{1, 0, 7, 1}, {9, 8, 15, 9}, {48, 24, 16, -1}, {64, 40, 17, 64}, {100, 64, 31, 100}, {200, 96, 400, -1}}},
	} {
		runGatherLayoutPTX(t, k, rng, c, 256, 3, 2, []int{32, 64}[i%2])
	}
}

// TestGatherLayoutPTXLoads checks which loads the kernel uses for an
// aligned piece of 1000 bytes followed by zeros: 16-byte loads for its
// whole vectors (and the ranges, three loads of each per thread), one
// 8-byte load for its last whole word, bytes for the word it shares with
// the zeros only, and no load at all for the zeros.
func TestGatherLayoutPTXLoads(t *testing.T) {
	k := gatherLayoutPTXKernel(t)
	rng := rand.New(rand.NewPCG(45, 46))
	const threads = 32
	// 1000 bytes: 62 vectors, then a whole word (its 8 bytes copied one
	// at a time, summed from one 8-byte load), then 11 words of zeros to
	// 1088, read from nowhere. 1001 bytes: the same and a word of one byte
	// and 7 zeros.
	for _, c := range []struct {
		name        string
		c           layoutCase
		v2, u64, u8 int
	}{
		{"a piece ending on a word", layoutCase{1088, 1024, 1024, [][4]int{{0, 0, 1000, 0}}}, 62, 1 + 1*threads, 8},
		{"a piece ending mid-word", layoutCase{1088, 1024, 1024, [][4]int{{0, 0, 1001, 0}}}, 62, 1 + 1*threads, 9 + 1},
		{"a piece only summed", layoutCase{1088, 1024, 1024, [][4]int{{0, 0, 1001, -1}}}, 62, 1 + 1*threads, 1},
	} {
		k.resetCounts()
		runGatherLayoutPTX(t, k, rng, c.c, 4096, 10, 1, threads)
		// Each thread loads its range's src/dst and len/sum with two
		// 16-byte loads and its at with one 8-byte load.
		got := [3]int{k.executed("ld.global.v2.u64"), k.executed("ld.global.u64"), k.executed("ld.global.u8")}
		if want := [3]int{c.v2 + 2*threads, c.u64, c.u8}; got != want {
			t.Errorf("%s: %d 16-byte, %d 8-byte and %d byte loads, want %v", c.name, got[0], got[1], got[2], want)
		}
	}
}

// TestLayoutSplitter checks the ranges CopySumLayout builds: every
// piece's bytes handed out once, in ranges of at most the chunk size that
// start on words of the layout and keep the piece's alignment; the layout
// [0, n) covered once, in order; runs of zeros of at most
// gatherLayoutExtend summed by the piece before them, longer ones by
// ranges of their own that read nothing.
func TestLayoutSplitter(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 48))
	for i := range 200 {
		chunk := []int{256, 1024, 4096}[i%3]
		c := randomLayout(rng, 1000+rng.IntN(50000), chunk)
		l, _ := c.layout(make([]byte, c.src))
		sp, err := newLayoutSplitter(l, uint64(c.n), uint64(chunk))
		if err != nil {
			t.Fatal(err)
		}
		placed := make([]int, c.n)
		pos := uint64(0)
		out := make([]uint64, (1+rng.IntN(20))*gatherLayoutWords)
		for !sp.done() {
			n := sp.fill(out)
			if n == 0 {
				t.Fatal("fill wrote nothing before done")
			}
			for r := range n {
				w := out[r*gatherLayoutWords : (r+1)*gatherLayoutWords]
				src, dst, size, sum, at := w[0], w[1], w[2], w[3], w[4]
				if at != pos || at%8 != 0 || size > uint64(chunk) || sum < size || sum == 0 || w[5] != 0 {
					t.Fatalf("layout %d: range %v at %d, expected %d (chunk %d)", i, w, at, pos, chunk)
				}
				if size == 0 && (src != 0 || dst != 0 || sum > uint64(chunk)) {
					t.Fatalf("layout %d: a range of zeros %v", i, w)
				}
				for j := at; j < at+size; j++ {
					placed[j]++
				}
				pos += sum
			}
		}
		if pos != uint64(c.n) {
			t.Fatalf("layout %d: the ranges sum %d of %d bytes", i, pos, c.n)
		}
		want := make([]int, c.n)
		for _, p := range c.pieces {
			for j := p[1]; j < p[1]+p[2]; j++ {
				want[j]++
			}
		}
		for j := range want {
			if placed[j] != want[j] {
				t.Fatalf("layout %d: byte %d handed out %d times, want %d", i, j, placed[j], want[j])
			}
		}
	}
}

// TestLayoutSplitterRefuses checks CopySumLayout's refusals: a piece
// outside the layout, one off a word, overlapping pieces.
func TestLayoutSplitterRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		n      uint64
		pieces [][2]int64 // at, size
		want   string
	}{
		"outside":          {100, [][2]int64{{96, 5}}, "not inside"},
		"past the end":     {100, [][2]int64{{104, 1}}, "not inside"},
		"off word":         {100, [][2]int64{{4, 5}}, "not on an 8-byte word"},
		"overlap":          {100, [][2]int64{{0, 17}, {16, 5}}, "overlap"},
		"unsorted overlap": {100, [][2]int64{{16, 5}, {0, 17}}, "overlap"},
	} {
		var l Layout
		for _, p := range c.pieces {
			l.Add(p[0], ptxLaySrcBase, p[1], 0)
		}
		_, err := newLayoutSplitter(&l, c.n, 1024)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

// TestGatherLayoutCheckCases runs the device self-test's cases
// (gatherLayoutCheck) through the kernel in the interpreter, so that a GPU
// rejects the kernel only for what the interpreter cannot see.
func TestGatherLayoutCheckCases(t *testing.T) {
	k := gatherLayoutPTXKernel(t)
	rng := rand.New(rand.NewPCG(49, 50))
	for _, cc := range gatherLayoutCheck {
		c := layoutCase{n: cc.n, src: gatherCheckSize, dst: gatherCheckSize}
		for _, p := range cc.pieces {
			d := -1
			if p[3] == 1 {
				d = p[0]
			}
			c.pieces = append(c.pieces, [4]int{p[0], p[1], p[2], d})
		}
		runGatherLayoutPTX(t, k, rng, c, gatherCheckChunk, gatherLayoutSlotRanges, 4, 32)
	}
}
