package gpu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/mac"
)

// The tests below run the generated mac_layout.ptx on the host, through
// the PTX interpreter, launched as CopyMACLayout launches it (its splitter
// fills the descriptor slots and says which chunks each launch covers),
// then mac_parents.ptx, and compare with mac.Sum of the layout as a buffer
// with zeros between the pieces, bit for bit, and every destination with
// its source. Each source is mapped read-only and exactly as long as its
// piece, each destination exactly as long, so that a read or a write of
// any byte outside a piece fails the test.

const (
	ptxMACLayoutSrcBase  = 0x7f3000000000
	ptxMACLayoutDstBase  = 0x7f4000000000
	ptxMACLayoutDescBase = 0x7f5000000000
	ptxMACLayoutSpacing  = 1 << 24 // between the pieces' regions
)

// macLayoutCase is a layout of pieces for the kernel: where each starts
// in the layout, its bytes, how far from a 16-byte boundary its source
// and its destination lie, and whether it has a destination.
type macLayoutCase struct {
	n      uint64
	at     []uint64
	data   [][]byte
	srcOff []uint64
	dstOff []uint64
	copied []bool
}

// flat is the layout as a buffer: the pieces' bytes at their positions,
// zeros elsewhere.
func (c *macLayoutCase) flat() []byte {
	b := make([]byte, c.n)
	for i, d := range c.data {
		copy(b[c.at[i]:], d)
	}
	return b
}

func (c *macLayoutCase) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "%d bytes:", c.n)
	for i := range c.at {
		fmt.Fprintf(&s, " [%d +%d src+%d", c.at[i], len(c.data[i]), c.srcOff[i])
		if c.copied[i] {
			fmt.Fprintf(&s, " dst+%d", c.dstOff[i])
		}
		s.WriteString("]")
	}
	return s.String()
}

// randomMACLayout returns a layout of 1 to 5 pieces, each after 0 to 2
// chunks of zeros, of sizes around blocks and chunks; some sources and
// destinations off a 16-byte boundary (read and written a byte at a time),
// some pieces without a destination; and zeros after the last piece.
func randomMACLayout(rng *rand.Rand, i int) *macLayoutCase {
	sizes := []int{1, 7, 63, 64, 65, 1023, 1024, 1025, 2048 + 17, 3000}
	c := &macLayoutCase{}
	at := uint64(0)
	for k := range 1 + rng.IntN(5) {
		if k > 0 || i%3 == 1 {
			at += uint64(rng.IntN(3)) * MACLayoutAlign
		}
		n := sizes[rng.IntN(len(sizes))]
		if rng.IntN(4) == 0 {
			n = 1 + rng.IntN(5000)
		}
		d := make([]byte, n)
		for j := range d {
			d[j] = byte(rng.Uint32())
		}
		var so, do uint64
		if rng.IntN(4) == 0 {
			so = uint64(1 + rng.IntN(15))
		}
		if rng.IntN(4) == 0 {
			do = uint64(8 * rng.IntN(2)) // 0 or 8: off a 16-byte boundary
		}
		c.at = append(c.at, at)
		c.data = append(c.data, d)
		c.srcOff = append(c.srcOff, so)
		c.dstOff = append(c.dstOff, do)
		c.copied = append(c.copied, rng.IntN(3) != 0)
		at = (at + uint64(n) + MACLayoutAlign - 1) / MACLayoutAlign * MACLayoutAlign
	}
	last := len(c.at) - 1
	c.n = c.at[last] + uint64(len(c.data[last])) + uint64([]int{0, 1, 64, 1500, 2048}[rng.IntN(5)])
	return c
}

// runMACLayoutPTX computes c's MAC with the kernels, slotPieces pieces per
// launch of the layout kernel and blocks of threads threads, and returns
// it with the destinations' bytes (nil for a piece without one).
func runMACLayoutPTX(t *testing.T, layoutK, parentsK *ptxKernel, key *mac.Key, c *macLayoutCase, slotPieces, threads int) (mac.Tag, [][]byte) {
	t.Helper()
	mem := &ptxMemory{}
	var l Layout
	dsts := make([][]byte, len(c.at))
	for i, d := range c.data {
		src := ptxMACLayoutSrcBase + uint64(i)*ptxMACLayoutSpacing + c.srcOff[i]
		mem.addRegion(src, d, true, fmt.Sprintf("piece %d's source", i))
		var dst uint64
		if c.copied[i] {
			dst = ptxMACLayoutDstBase + uint64(i)*ptxMACLayoutSpacing + c.dstOff[i]
			dsts[i] = make([]byte, len(d))
			mem.addRegion(dst, dsts[i], false, fmt.Sprintf("piece %d's destination", i))
		}
		l.Add(int64(c.at[i]), src, int64(len(d)), dst)
	}
	sp, err := newMACLayoutSplitter(&l, c.n)
	if err != nil {
		t.Fatalf("%v: %v", c, err)
	}
	cvs := make([]byte, 32*sp.chunks)
	out := make([]byte, 32)
	mem.add(ptxMACCVBase, cvs)
	mem.add(ptxMACOutBase, out)
	k := macKeyParams(key)
	grid := func(n uint64) int { return int((n + uint64(threads) - 1) / uint64(threads)) }
	for launch := 0; !sp.done(); launch++ {
		words := make([]uint64, slotPieces*macLayoutWords)
		count := sp.fill(words)
		desc := make([]byte, 8*count*macLayoutWords)
		for j := range count * macLayoutWords {
			binary.LittleEndian.PutUint64(desc[8*j:], words[j])
		}
		base := ptxMACLayoutDescBase + uint64(launch)*ptxMACLayoutSpacing
		mem.addRegion(base, desc, true, fmt.Sprintf("launch %d's pieces", launch))
		c0, c1 := sp.launched()
		if c1 <= c0 {
			t.Fatalf("%v: launch %d covers chunks %d to %d", c, launch, c0, c1)
		}
		if err := layoutK.run(mem, grid(c1-c0), threads, base, uint64(count), c0, c1, c.n, k[0], k[1], k[2], k[3], ptxMACCVBase, ptxMACOutBase); err != nil {
			t.Fatalf("%v: layout launch %d (chunks %d to %d): %v", c, launch, c0, c1, err)
		}
	}
	for i, pl := range macPlan(sp.chunks, macParentLevels) {
		if err := parentsK.run(mem, grid(pl.threads), threads, ptxMACCVBase, pl.m, uint64(pl.shift), uint64(pl.levels), k[0], k[1], k[2], k[3], ptxMACOutBase); err != nil {
			t.Fatalf("%v: parent launch %d (%+v): %v", c, i, pl, err)
		}
	}
	return mac.Tag(out), dsts
}

// macLayoutKernel is one of the layout kernels, parsed, with the block
// sizes its tests launch it with: mac_layout.ptx's blocks move their
// chunks together and are of macThreads threads; mac_layout_read.ptx's
// threads work alone.
type macLayoutKernel struct {
	k       *ptxKernel
	threads []int
}

func macLayoutKernels(t *testing.T) []macLayoutKernel {
	t.Helper()
	var ks []macLayoutKernel
	for _, f := range []struct {
		file, text, entry string
		threads           []int
	}{
		{"mac_layout.ptx", macLayoutPTX, "wc_mac_layout", []int{macThreads}},
		{"mac_layout_read.ptx", macLayoutReadPTX, "wc_mac_layout_read", []int{1, 32, 7, 64}},
	} {
		k := parsePTX(t, f.file, f.text)
		if k.name != f.entry || len(k.params) != 11 {
			t.Fatalf("kernel %s(%v): want %s(pieces, count, c0, c1, n, key01, key23, key45, key67, cvs, out)", k.name, k.params, f.entry)
		}
		ks = append(ks, macLayoutKernel{k, f.threads})
	}
	return ks
}

// TestMACLayoutPTX compares each layout kernel's MAC of random layouts
// (randomMACLayout) with mac.Sum of the same layout as a buffer, under
// random keys and launches of 1, 2 and 4096 pieces, and checks that every
// piece with a destination was copied there whole.
func TestMACLayoutPTX(t *testing.T) {
	_, parentsK := macPTXKernels(t)
	slots := []int{1, 2, macLayoutSlotPieces}
	for _, lk := range macLayoutKernels(t) {
		rng := rand.New(rand.NewPCG(31, 32))
		for i := range 36 {
			c := randomMACLayout(rng, i)
			key, _ := randomMACCase(rng, 0)
			want := mac.Sum(key, c.flat())
			got, dsts := runMACLayoutPTX(t, lk.k, parentsK, key, c, slots[i%len(slots)], lk.threads[i%len(lk.threads)])
			if got != want {
				t.Fatalf("%s: %v, %d pieces per launch: kernels give %s, mac.Sum %s", lk.k.name, c, slots[i%len(slots)], got, want)
			}
			for j, d := range dsts {
				if d != nil && !bytes.Equal(d, c.data[j]) {
					t.Fatalf("%s: %v: piece %d's destination does not hold its bytes", lk.k.name, c, j)
				}
			}
		}
	}
}

// TestMACLayoutOneChunk checks, with each layout kernel, the root of a
// layout of one chunk or less, which the kernel writes itself (no parent
// launch), of a layout whose one piece lies past zero chunks, and of one
// of three blocks of threads' chunks.
func TestMACLayoutOneChunk(t *testing.T) {
	_, parentsK := macPTXKernels(t)
	rng := rand.New(rand.NewPCG(33, 34))
	key, _ := randomMACCase(rng, 0)
	cases := []*macLayoutCase{
		{n: 1, at: []uint64{0}, data: [][]byte{{7}}, srcOff: []uint64{0}, dstOff: []uint64{0}, copied: []bool{true}},
		{n: 1024, at: []uint64{0}, data: [][]byte{bytes.Repeat([]byte{3}, 1000)}, srcOff: []uint64{5}, dstOff: []uint64{0}, copied: []bool{false}},
		{n: 5000, at: []uint64{4096}, data: [][]byte{bytes.Repeat([]byte{9}, 900)}, srcOff: []uint64{0}, dstOff: []uint64{8}, copied: []bool{true}},
		// Three blocks of chunks: pieces across a block's end.
		{n: 300 << 10, at: []uint64{0, 127 << 10, 200 << 10}, data: [][]byte{randomBytes(rng, 100<<10+5), randomBytes(rng, 3<<10), randomBytes(rng, 100<<10)},
			srcOff: []uint64{0, 0, 0}, dstOff: []uint64{0, 8, 0}, copied: []bool{true, true, false}},
	}
	for _, lk := range macLayoutKernels(t) {
		for _, c := range cases {
			want := mac.Sum(key, c.flat())
			if got, _ := runMACLayoutPTX(t, lk.k, parentsK, key, c, macLayoutSlotPieces, macThreads); got != want {
				t.Errorf("%s: %v: kernels give %s, mac.Sum %s", lk.k.name, c, got, want)
			}
		}
	}
}

// TestMACLayoutSplitterRefuses checks that a layout whose piece starts
// off a chunk, or overlaps another, is refused with a reason.
func TestMACLayoutSplitterRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		add  func(l *Layout)
		want string
	}{
		{"off a chunk", func(l *Layout) { l.Add(0, 0x1000, 10, 0); l.Add(1032, 0x2000, 10, 0) }, "not on a multiple of 1024"},
		{"overlapping", func(l *Layout) { l.Add(0, 0x1000, 2000, 0); l.Add(1024, 0x2000, 10, 0) }, "overlap"},
		{"outside", func(l *Layout) { l.Add(1024, 0x1000, 2000, 0) }, "not inside"},
	} {
		var l Layout
		tc.add(&l)
		_, err := newMACLayoutSplitter(&l, 2048)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}
