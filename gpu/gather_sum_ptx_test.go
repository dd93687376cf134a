package gpu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/checksum"
)

// The tests below run the generated gather_sum.ptx on the host, through
// the PTX interpreter of ptx_interp_test.go, on ranges built by
// sumSplitter as CopySum builds them, and compare the bytes copied with
// the copies and the sum with checksum.Sum of the summed buffer. The
// summed buffer is a region of exactly n bytes (so nothing past n is
// read) and the side the copies read is read-only.

const (
	ptxSumBufBase   = 0x7f0000000000 // the summed buffer
	ptxSumOtherBase = 0x7f1000000000 // the copies' other side
	ptxSumDescBase  = 0x7f2000000000
	ptxSumSlotsBase = 0x7f3000000000
)

func gatherSumPTXKernel(t *testing.T) *ptxKernel {
	t.Helper()
	return gatherSumPTXKernelOf(t, "gather_sum.ptx", gatherSumPTX)
}

// gatherSumPTXKernelOf parses a fused gather and checksum kernel (file
// names it).
func gatherSumPTXKernelOf(t *testing.T, file, src string) *ptxKernel {
	t.Helper()
	k := parsePTX(t, file, src)
	if k.name != "wc_gather_sum" || len(k.params) != 6 || k.paramSize[1] != 4 || k.paramSize[3] != 4 || k.paramSize[5] != 4 {
		t.Fatalf("%s: kernel %s(%v): want wc_gather_sum(u64 ranges, u32 count, u64 base, u32 side, u64 slots, u32 first)", file, k.name, k.params)
	}
	return k
}

// sumLayout is a fused copy to test: copies between the summed buffer
// (n bytes) and the other side (other bytes), summed-buffer offset, other
// offset and size each.
type sumLayout struct {
	side   SumSide
	n      int
	other  int
	copies [][3]int
}

// randomSumLayout returns copies into or out of a summed buffer of about
// size bytes: at word-aligned offsets (mostly at multiples of 64, as pack
// places entries), after gaps of 0 bytes to past gatherSumExtend, of 1
// byte to past several pieces of chunk bytes, their other sides 16-byte
// aligned or not.
func randomSumLayout(rng *rand.Rand, side SumSide, size, chunk int) sumLayout {
	l := sumLayout{side: side}
	at, other := 0, 0
	if rng.IntN(3) == 0 {
		at = 8 * rng.IntN(100) // a gap before the first copy
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
		o := other + rng.IntN(40)
		if rng.IntN(2) == 0 {
			o = (o + 15) &^ 15
		}
		l.copies = append(l.copies, [3]int{at, o, n})
		other = o + n
		end := at + n
		switch rng.IntN(5) {
		case 0: // the next copy starts on the next word
			at = (end + 7) &^ 7
		case 1: // a long gap
			at = (end + gatherSumExtend + 8*rng.IntN(200) + 7) &^ 7
		default: // alignment padding, as pack leaves it
			at = (end + 63) &^ 63
		}
	}
	l.n = min(size, at+rng.IntN(3)*rng.IntN(400))
	if len(l.copies) > 0 {
		if last := l.copies[len(l.copies)-1]; l.n < last[0]+last[2] {
			l.n = last[0] + last[2]
		}
	}
	l.other = other + 16
	if rng.IntN(4) == 0 {
		rng.Shuffle(len(l.copies), func(i, j int) { l.copies[i], l.copies[j] = l.copies[j], l.copies[i] })
	}
	return l
}

// fusedCase is one fused copy of a sequence (runSumSequence): its layout,
// where it lies in the sequence's two buffers, the bytes expected there
// once it has run, and its sum (wait, which the sequence's queue sets).
type fusedCase struct {
	l                     sumLayout
	summedAt, otherAt     int // the layout's offsets in the buffers
	wantSummed, wantOther []byte
	wait                  func() (uint64, error)
}

// check compares the bytes of fc's regions of the buffers as they are
// after it ran, summed and other, and its sum with what it expects.
func (fc *fusedCase) check(sum uint64, summed, other []byte) error {
	l := fc.l
	for name, c := range map[string][2][]byte{"summed buffer": {summed, fc.wantSummed}, "other side": {other, fc.wantOther}} {
		if i := diffAt(c[0], c[1]); i >= 0 {
			return fmt.Errorf("%d copies, side %d, %d bytes: byte %d of the %s is %#x, want %#x", len(l.copies), l.side, l.n, i, name, c[0][i], c[1][i])
		}
	}
	if want := checksum.Sum(fc.wantSummed); sum != want {
		return fmt.Errorf("%d copies, side %d, %d bytes: the fused checksum is %#x, want %#x", len(l.copies), l.side, l.n, sum, want)
	}
	return nil
}

// runSumSequence runs layouts in turn through fused copies between a
// summed and an other buffer, several outstanding at once: queue queues
// a case on the device, check waits for the cases queued since it last
// ran and checks them. Each layout is placed after the one before it (on
// 16-byte boundaries); when the next one does not fit, check runs and
// placement starts over at offset 0, over bytes that earlier cases wrote.
// summed and other are the host's copy of the buffers: runSumSequence
// keeps them what the buffers hold once every queued case has run (a
// case expects its copies applied to that), so that they stay true across
// calls too.
func runSumSequence(summed, other []byte, layouts []sumLayout, queue func(fc *fusedCase) error, check func(cases []*fusedCase) error) error {
	var cases []*fusedCase
	summedAt, otherAt := 0, 0
	for _, l := range layouts {
		if summedAt+l.n > len(summed) || otherAt+l.other > len(other) {
			if err := check(cases); err != nil {
				return err
			}
			cases, summedAt, otherAt = nil, 0, 0
		}
		s, o := summed[summedAt:summedAt+l.n], other[otherAt:otherAt+l.other]
		for _, cp := range l.copies {
			at, from, n := cp[0], cp[1], cp[2]
			if l.side == SumDst {
				copy(s[at:at+n], o[from:from+n])
			} else {
				copy(o[from:from+n], s[at:at+n])
			}
		}
		fc := &fusedCase{l: l, summedAt: summedAt, otherAt: otherAt, wantSummed: bytes.Clone(s), wantOther: bytes.Clone(o)}
		if err := queue(fc); err != nil {
			return err
		}
		cases = append(cases, fc)
		summedAt, otherAt = (summedAt+l.n+15)&^15, (otherAt+l.other+15)&^15
	}
	return check(cases)
}

// ptxSumDevice runs the fused copies of a sequence through the kernel in
// the interpreter, on two byte slices that stand for the device buffers:
// in launches of at most slotRanges ranges of at most chunk bytes, one
// block of threads threads per range.
type ptxSumDevice struct {
	k                          *ptxKernel
	summed, other              []byte
	chunk, slotRanges, threads int
}

func (d *ptxSumDevice) queue(fc *fusedCase) error {
	sum, err := ptxCopySum(d.k, d.summed[fc.summedAt:fc.summedAt+fc.l.n], d.other[fc.otherAt:fc.otherAt+fc.l.other], fc.l, d.chunk, d.slotRanges, d.threads)
	fc.wait = func() (uint64, error) { return sum, err }
	return nil
}

func (d *ptxSumDevice) check(cases []*fusedCase) error {
	for _, fc := range cases {
		sum, err := fc.wait()
		if err != nil {
			return err
		}
		if err := fc.check(sum, d.summed[fc.summedAt:fc.summedAt+fc.l.n], d.other[fc.otherAt:fc.otherAt+fc.l.other]); err != nil {
			return err
		}
	}
	return nil
}

// ptxCopySum runs the layout l through the kernel, as CopySum describes it
// to the GPU (see ptxSumDevice), between summed and other (the layout's
// regions: nothing past them may be read) and returns the fused checksum.
func ptxCopySum(k *ptxKernel, summed, other []byte, l sumLayout, chunk, slotRanges, threads int) (uint64, error) {
	var b CopyBatch
	for _, c := range l.copies {
		s, o, n := c[0], c[1], c[2]
		if l.side == SumDst {
			b.Add(ptxSumBufBase+uint64(s), ptxSumOtherBase+uint64(o), int64(n))
		} else {
			b.Add(ptxSumOtherBase+uint64(o), ptxSumBufBase+uint64(s), int64(n))
		}
	}
	sp, err := newSumSplitter(&b, ptxSumBufBase, uint64(l.n), l.side, uint64(chunk))
	if err != nil {
		return 0, err
	}
	words := make([]uint64, slotRanges*gatherSumWords)
	desc := make([]byte, len(words)*8)
	slot := newPTXSumSlot()
	copy(slot[checksumResult:], "a result of an earlier sum, which the first launch replaces")
	for launch := 0; !sp.done(); launch++ {
		n := sp.fill(words)
		for i, w := range words[:n*gatherSumWords] {
			binary.LittleEndian.PutUint64(desc[8*i:], w)
		}
		mem := &ptxMemory{}
		mem.addRegion(ptxSumBufBase, summed, l.side == SumSrc, "summed buffer")
		mem.addRegion(ptxSumOtherBase, other, l.side == SumDst, "other side")
		mem.addRegion(ptxSumDescBase, desc[:n*gatherSumWords*8], true, "ranges")
		mem.add(ptxSumSlotsBase, slot)
		if err := k.runBlocks(mem, n, threads, reversed(n), ptxSumDescBase, uint64(n), ptxSumBufBase, uint64(l.side), ptxSumSlotsBase, ptxFirst(launch == 0)); err != nil {
			return 0, fmt.Errorf("%d copies, side %d, %d bytes: launch %d: %w", len(l.copies), l.side, l.n, launch, err)
		}
	}
	sum, err := slot.sum()
	if err != nil {
		return 0, fmt.Errorf("%d copies, side %d, %d bytes: %w", len(l.copies), l.side, l.n, err)
	}
	return checksum.Finish(sum, int64(l.n)), nil
}

// reversed is the order n, ..., 1, 0 of a grid's n blocks: the kernels'
// tests run their blocks in other orders than 0 to n-1, so that the last
// block to finish, which moves the partial sums into the result, is not
// always the last of the grid.
func reversed(n int) []int {
	o := make([]int, n)
	for i := range o {
		o[i] = n - 1 - i
	}
	return o
}

// runGatherSumPTX runs the layout l through the kernel (see ptxSumDevice)
// from random bytes, and checks the bytes copied and the sum.
func runGatherSumPTX(t *testing.T, k *ptxKernel, rng *rand.Rand, l sumLayout, chunk, slotRanges, threads int) {
	t.Helper()
	summed, other := randomBytes(rng, l.n), randomBytes(rng, l.other)
	d := &ptxSumDevice{k: k, summed: bytes.Clone(summed), other: bytes.Clone(other), chunk: chunk, slotRanges: slotRanges, threads: threads}
	if err := runSumSequence(summed, other, []sumLayout{l}, d.queue, d.check); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestGatherSumPTXSequence runs layouts in sequence as TestGatherSumGPU
// does, several to a pair of buffers, scaled down: the one that does not
// fit after the others is placed over bytes they wrote (its copies read
// what an earlier SumSrc case wrote into the other buffer), so its
// expected bytes and sum hold only if the host's copy of the buffers
// follows every case queued. (It did not once, and TestGatherSumGPU
// failed on 128 MiB of correct sums.)
func TestGatherSumPTXSequence(t *testing.T) {
	k := gatherSumPTXKernel(t)
	rng := rand.New(rand.NewPCG(41, 42))
	const size = 48 << 10
	summed, other := randomBytes(rng, size), randomBytes(rng, size)
	d := &ptxSumDevice{k: k, summed: bytes.Clone(summed), other: bytes.Clone(other), chunk: 4096, slotRanges: 5, threads: 32}
	layouts := []sumLayout{
		randomSumLayout(rng, SumSrc, 16<<10, 4096),
		randomSumLayout(rng, SumDst, 16<<10, 4096),
		{SumDst, 32<<10 + 3, 16<<10 + 16, [][3]int{{0, 0, 16 << 10}, {16<<10 + 64, 16, 16<<10 - 61}}},
		randomSumLayout(rng, SumSrc, 8<<10, 4096),
		{SumSrc, 40 << 10, 40 << 10, [][3]int{{0, 0, 40 << 10}}},
	}
	if err := runSumSequence(summed, other, layouts, d.queue, d.check); err != nil {
		t.Fatal(err)
	}
}

// TestGatherSumPTX runs random layouts both ways (copies into the summed
// buffer and out of it), some dense (see sumSplitter), under small pieces
// and descriptor slots and blocks of one to eight warps.
func TestGatherSumPTX(t *testing.T) {
	k := gatherSumPTXKernel(t)
	rng := rand.New(rand.NewPCG(31, 32))
	for i := range 16 {
		side := SumSide(i % 2)
		chunk := []int{1024, 4096, 256}[i%3]
		l := randomSumLayout(rng, side, 10000+rng.IntN(30000), chunk)
		if i%4 == 3 {
			l = denseSumLayout(rng, l)
		}
		threads := []int{32, 64, 96, 32}[i%4]
		if i == 9 {
			threads = 256
		}
		runGatherSumPTX(t, k, rng, l, chunk, 1+rng.IntN(60), threads)
	}
}

// TestGatherSumPTXEdges runs the layouts at the edges: no copies (the sum
// alone), one byte, a copy ending in the buffer's last partial word, a gap
// of exactly gatherSumExtend and one byte more, a copy whose other side
// is misaligned, and copies of under 16 bytes.
func TestGatherSumPTXEdges(t *testing.T) {
	k := gatherSumPTXKernel(t)
	rng := rand.New(rand.NewPCG(33, 34))
	for i, l := range []sumLayout{
		{SumDst, 5000, 16, nil},
		{SumSrc, 13, 16, nil},
		{SumDst, 1, 16, [][3]int{{0, 0, 1}}},
		{SumSrc, 1, 16, [][3]int{{0, 3, 1}}},
		{SumDst, 1003, 2000, [][3]int{{0, 16, 1003}}},
		{SumDst, 1003, 2000, [][3]int{{0, 16, 997}}},
		{SumSrc, 1003, 2000, [][3]int{{64, 5, 939}}},
		{SumDst, 4000, 4000, [][3]int{{0, 0, 100}, {104 + gatherSumExtend, 112, 50}, {168 + 2*gatherSumExtend, 200, 50}}},
		{SumSrc, 4000, 4000, [][3]int{{0, 0, 100}, {104 + gatherSumExtend, 112, 50}, {168 + 2*gatherSumExtend, 200, 50}}},
		{SumDst, 600, 700, [][3]int{{0, 1, 7}, {8, 9, 15}, {24, 48, 16}, {40, 64, 17}, {64, 100, 31}, {96, 200, 400}}},
		{SumSrc, 600, 700, [][3]int{{0, 1, 7}, {8, 9, 15}, {24, 48, 16}, {40, 64, 17}, {64, 100, 31}, {96, 200, 400}}},
	} {
		runGatherSumPTX(t, k, rng, l, 256, 3, []int{32, 64}[i%2])
	}
}

// TestGatherSumPTXLoads checks which loads the kernel uses for aligned
// copies: 16-byte loads for the copies' whole vectors (and the ranges, two
// per thread each), one 8-byte load for each whole word of a copy's tail
// and of the padding after it, bytes for the tail's copy and for the word
// a copy's end shares with the padding only.
func TestGatherSumPTXLoads(t *testing.T) {
	k := gatherSumPTXKernel(t)
	rng := rand.New(rand.NewPCG(35, 36))
	const threads = 32
	for _, c := range []struct {
		name        string
		l           sumLayout
		ranges      int
		v2, u64, u8 int
	}{
		// 1000 bytes: 62 vectors, a word from the source (its 8 bytes
		// copied one at a time) and 3 words of padding from the buffer;
		// then 4 vectors.
		{"aligned copies", sumLayout{SumDst, 1088, 2048, [][3]int{{0, 0, 1000}, {1024, 1008, 64}}}, 2, 62 + 4, 4, 8},
		// 1001 bytes: 62 vectors, a word from the source, a word of one
		// source byte and 7 padding bytes, 2 words of padding.
		{"a copy ending mid-word", sumLayout{SumDst, 1024, 1024, [][3]int{{0, 0, 1001}}}, 1, 62, 3, 9 + 8},
	} {
		k.resetCounts()
		runGatherSumPTX(t, k, rng, c.l, 4096, 10, threads)
		got := [3]int{k.executed("ld.global.v2.u64"), k.executed("ld.global.u64"), k.executed("ld.global.u8")}
		if want := [3]int{c.v2 + 2*threads*c.ranges, c.u64, c.u8}; got != want {
			t.Errorf("%s: %d 16-byte, %d 8-byte and %d byte loads, want %v", c.name, got[0], got[1], got[2], want)
		}
	}
}

// TestSumSplitter checks the ranges CopySum builds: every copy's bytes
// copied once, in pieces of at most the chunk size that keep its
// alignment; the summed bytes [0, n) covered once, in order, from word
// boundaries; gaps of at most gatherSumExtend summed by the copy before
// them, longer ones by ranges of their own.
func TestSumSplitter(t *testing.T) {
	rng := rand.New(rand.NewPCG(37, 38))
	dense := 0
	for i := range 200 {
		side := SumSide(i % 2)
		chunk := []int{256, 1024, 4096}[i%3]
		l := randomSumLayout(rng, side, 1000+rng.IntN(50000), chunk)
		if i%4 >= 2 {
			// Most are dense (see sumSplitter): short gaps only, and
			// maybe none before the first copy or after the last.
			l = denseSumLayout(rng, l)
		}
		var b CopyBatch
		for _, c := range l.copies {
			if side == SumDst {
				b.Add(ptxSumBufBase+uint64(c[0]), ptxSumOtherBase+uint64(c[1]), int64(c[2]))
			} else {
				b.Add(ptxSumOtherBase+uint64(c[1]), ptxSumBufBase+uint64(c[0]), int64(c[2]))
			}
		}
		sp, err := newSumSplitter(&b, ptxSumBufBase, uint64(l.n), side, uint64(chunk))
		if err != nil {
			t.Fatal(err)
		}
		if sp.dense {
			dense++
		}
		copied := make([]int, l.n)
		pos := uint64(0)
		out := make([]uint64, (1+rng.IntN(20))*gatherSumWords)
		for !sp.done() {
			n := sp.fill(out)
			if n == 0 {
				t.Fatal("fill wrote nothing before done")
			}
			for r := range n {
				w := out[r*gatherSumWords : (r+1)*gatherSumWords]
				src, dst, size, sum := w[0], w[1], w[2], w[3]
				at := dst
				if side == SumSrc {
					at = src
				}
				if at-ptxSumBufBase != pos || size > uint64(chunk) || sum < size || sum == 0 {
					t.Fatalf("layout %d: range %v at summed offset %d, expected %d (chunk %d)", i, w, at-ptxSumBufBase, pos, chunk)
				}
				if size == 0 && src != dst {
					t.Fatalf("layout %d: a range that only sums copies %v", i, w)
				}
				if size > 0 && (at-ptxSumBufBase)%8 != 0 {
					t.Fatalf("layout %d: a range starts off a word: %v", i, w)
				}
				if size == 0 && sum > uint64(chunk) {
					t.Fatalf("layout %d: a range that only sums %d bytes", i, sum)
				}
				for j := at - ptxSumBufBase; j < at-ptxSumBufBase+size; j++ {
					copied[j]++
				}
				pos += sum
			}
		}
		if pos != uint64(l.n) {
			t.Fatalf("layout %d: the ranges sum %d of %d bytes", i, pos, l.n)
		}
		want := make([]int, l.n)
		for _, c := range l.copies {
			for j := c[0]; j < c[0]+c[2]; j++ {
				want[j]++
			}
		}
		for j := range want {
			if copied[j] != want[j] {
				t.Fatalf("layout %d: byte %d of the summed buffer copied %d times, want %d", i, j, copied[j], want[j])
			}
		}
	}
	t.Logf("%d of 200 layouts dense", dense)
	if dense < 40 || dense > 160 {
		t.Fatalf("%d of 200 layouts dense, want both kinds (fill and fillDense) well covered", dense)
	}
}

// denseSumLayout moves l's copies, in order, after gaps of at most
// gatherSumExtend bytes, rarely longer (the last one often, and the one
// before the first copy mostly, zero), so that most such layouts are
// dense.
func denseSumLayout(rng *rand.Rand, l sumLayout) sumLayout {
	slices.SortFunc(l.copies, func(a, b [3]int) int { return a[0] - b[0] })
	at := 0
	if rng.IntN(4) == 0 {
		at = 8 * rng.IntN(40)
	}
	for i := range l.copies {
		l.copies[i][0] = at
		at = (at + l.copies[i][2] + 7) &^ 7
		if r := rng.IntN(100); r == 0 {
			at += gatherSumExtend + 8 // too long: the layout is not dense
		} else if r <= 20 {
			at += 8 * rng.IntN(gatherSumExtend/8+1)
		}
	}
	l.n = max(0, at-8*rng.IntN(2))
	if k := len(l.copies); k > 0 && l.n < l.copies[k-1][0]+l.copies[k-1][2] {
		l.n = l.copies[k-1][0] + l.copies[k-1][2]
	}
	return l
}

// TestSumSplitterRefuses checks CopySum's refusals: a copy outside the
// summed bytes, one off a word of the buffer, overlapping copies, a
// misaligned buffer.
func TestSumSplitterRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		base   uint64
		n      uint64
		copies [][3]uint64 // summed offset, other address, size
		want   string
	}{
		"outside":           {ptxSumBufBase, 100, [][3]uint64{{96, 0, 5}}, "not inside"},
		"before":            {ptxSumBufBase + 64, 100, [][3]uint64{{0, 0, 5}}, "not inside"},
		"off word":          {ptxSumBufBase, 100, [][3]uint64{{4, 0, 5}}, "not on an 8-byte word"},
		"overlap":           {ptxSumBufBase, 100, [][3]uint64{{0, 0, 17}, {16, 0, 5}}, "overlap"},
		"unsorted overlap":  {ptxSumBufBase, 100, [][3]uint64{{16, 0, 5}, {0, 0, 17}}, "overlap"},
		"misaligned buffer": {ptxSumBufBase + 4, 100, nil, "not 8-byte aligned"},
	} {
		var b CopyBatch
		for _, cp := range c.copies {
			b.Add(ptxSumBufBase+cp[0], ptxSumOtherBase+cp[1], int64(cp[2]))
		}
		_, err := newSumSplitter(&b, c.base, c.n, SumDst, 1024)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

// TestGatherSumCheckCases runs the device self-test's cases
// (gatherSumCheck) through the kernel in the interpreter, so that a GPU
// rejects the kernel only for what the interpreter cannot see.
func TestGatherSumCheckCases(t *testing.T) {
	k := gatherSumPTXKernel(t)
	rng := rand.New(rand.NewPCG(39, 40))
	for _, c := range gatherSumCheck {
		runGatherSumPTX(t, k, rng, sumLayout{c.side, c.n, gatherCheckSize, c.copies}, gatherCheckChunk, gatherSumSlotRanges, 32)
	}
}

// TestGatherSumPTXLarge runs the layout of 128 MiB that TestGatherSumGPU
// once failed on (two copies of 64 MiB with a gap of 64 bytes between
// them, the second ending 3 bytes into a word) at full size in pieces of
// 256 KiB, as it failed: only the blocks of the first and last pieces of
// each copy and those next to them, in memory mapped only where those
// blocks may read and write, so that the test stays fast. It checks their copies and
// their part of the sum against the checksum's definition (wordSums), at
// word indices past 2^24 and descriptors far into the slot, where 32-bit
// arithmetic would break.
func TestGatherSumPTXLarge(t *testing.T) {
	k := gatherSumPTXKernel(t)
	l := sumLayout{SumDst, 128<<20 + 3, 64<<20 + 16, [][3]int{{0, 0, 64 << 20}, {64<<20 + 64, 16, 64<<20 - 61}}}
	var b CopyBatch
	for _, c := range l.copies {
		b.Add(ptxSumBufBase+uint64(c[0]), ptxSumOtherBase+uint64(c[1]), int64(c[2]))
	}
	sp, err := newSumSplitter(&b, ptxSumBufBase, uint64(l.n), l.side, 256<<10)
	if err != nil {
		t.Fatal(err)
	}
	words := make([]uint64, gatherSumSlotRanges*gatherSumWords)
	n := sp.fill(words)
	if !sp.done() || n != 512 {
		t.Fatalf("%d ranges in the first slot (done %v), want all 512", n, sp.done())
	}
	desc := make([]byte, n*gatherSumWords*8)
	for i, w := range words[:n*gatherSumWords] {
		binary.LittleEndian.PutUint64(desc[8*i:], w)
	}
	mem := &ptxMemory{}
	mem.addRegion(ptxSumDescBase, desc, true, "ranges")
	slot := newPTXSumSlot()
	mem.add(ptxSumSlotsBase, slot)
	// byteAt gives the bytes of both buffers by their offsets, so that the
	// windows of overlapping sources agree.
	byteAt := func(buf, off uint64) byte { return byte(((buf<<40 + off) * 0x9e3779b97f4a7c15) >> 56) }
	which := []int{0, 1, 254, 255, 256, 257, 510, 511}
	type window struct {
		summed, want []byte
	}
	var wins []window
	var want uint64
	for _, r := range which {
		w := words[r*gatherSumWords : (r+1)*gatherSumWords]
		src, dst, size, sum := w[0], w[1], w[2], w[3]
		from := make([]byte, size)
		for i := range from {
			from[i] = byteAt(2, src-ptxSumOtherBase+uint64(i))
		}
		mem.addRegion(src, from, true, fmt.Sprintf("range %d's source", r))
		win := window{summed: make([]byte, sum)}
		for i := range win.summed {
			win.summed[i] = byteAt(1, dst-ptxSumBufBase+uint64(i))
		}
		mem.addRegion(dst, win.summed, false, fmt.Sprintf("range %d's summed bytes", r))
		win.want = bytes.Clone(win.summed)
		copy(win.want, from)
		wins = append(wins, win)
		want += wordSums(win.want, (dst-ptxSumBufBase)/8)
	}
	if err := k.runBlocks(mem, n, 64, which, ptxSumDescBase, uint64(n), ptxSumBufBase, uint64(l.side), ptxSumSlotsBase, 1); err != nil {
		t.Fatal(err)
	}
	for i, win := range wins {
		if j := diffAt(win.summed, win.want); j >= 0 {
			t.Fatalf("range %d: byte %d is %#x, want %#x", which[i], j, win.summed[j], win.want[j])
		}
	}
	// Only some of the grid's blocks ran, so none was the last: their sums
	// are in the partials, and the ticket counts them.
	var got uint64
	for i := range checksumSlots {
		got += binary.LittleEndian.Uint64(slot[8*i:])
	}
	if got != want {
		t.Fatalf("the blocks %v added %#x into the partials, want %#x", which, got, want)
	}
	if tk := binary.LittleEndian.Uint32(slot[checksumTicket:]); tk != uint32(len(which)) {
		t.Fatalf("the ticket is %d after %d blocks", tk, len(which))
	}
	// wordSums is the definition checksum.Sum finishes (the last window
	// ends in a partial word).
	if last := wins[len(wins)-1].want; checksum.Finish(wordSums(last, 0), int64(len(last))) != checksum.Sum(last) {
		t.Fatal("wordSums disagrees with checksum.Sum")
	}
}

// wordSums returns the sum of the checksum's word contributions (see
// package checksum) of b, whose first word is word first of its buffer:
// fmix64(w_i + (i+1)·φ) for each word w_i, the last one zero-padded.
func wordSums(b []byte, first uint64) uint64 {
	fmix64 := func(k uint64) uint64 {
		k ^= k >> 33
		k *= 0xff51afd7ed558ccd
		k ^= k >> 33
		k *= 0xc4ceb9fe1a85ec53
		return k ^ k>>33
	}
	var s uint64
	for i := 0; i < len(b); i += 8 {
		var w [8]byte
		copy(w[:], b[i:])
		s += fmix64(binary.LittleEndian.Uint64(w[:]) + (first+uint64(i/8)+1)*0x9e3779b97f4a7c15)
	}
	return s
}

// BenchmarkSplitters measures what Gather.Copy and Gather.CopySum spend on
// the host per copy to describe 100,000 copies of 4 KiB into a bucket as
// kernel ranges, slot by slot (the rest of their cost per copy is the
// caller's CopyBatch.Add and the GPU's).
func BenchmarkSplitters(b *testing.B) {
	const count, size = 100_000, 4 << 10
	var cb CopyBatch
	for i := range count {
		cb.Add(ptxSumBufBase+uint64(i*size), ptxSumOtherBase+uint64(2*i*size), size)
	}
	b.Run("gather", func(b *testing.B) {
		out := make([]uint64, gatherSlotRanges*gatherWords)
		for range b.N {
			for sp := (&rangeSplitter{b: &cb, chunk: GatherChunk}); !sp.done(); {
				sp.fill(out)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*count), "ns/copy")
	})
	b.Run("fused", func(b *testing.B) {
		out := make([]uint64, gatherSumSlotRanges*gatherSumWords)
		for range b.N {
			sp, err := newSumSplitter(&cb, ptxSumBufBase, count*size, SumDst, GatherChunk)
			if err != nil {
				b.Fatal(err)
			}
			for !sp.done() {
				sp.fill(out)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*count), "ns/copy")
	})
}
