package gpu

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/weightcast/weightcast/mac"
)

// The tests below run the embedded poly.ptx on the host, through the PTX
// interpreter of ptx_interp_test.go, as checksum_ptx_test.go runs the
// checksum kernel: the message is mapped read-only and exactly n bytes
// long, and so is the key's table of powers.

const ptxPolyTableBase = 0x7f2000000000

func polyPTXKernel(t *testing.T) *ptxKernel {
	k := parsePTX(t, "poly.ptx", polyPTX)
	checkPolyParams(t, k, "wc_poly", "buf", "n", "blk", "q")
	return k
}

// checkPolyParams checks that kernel k is entry, its parameters head
// then those polyParams adds (rs01, rs23, rs4, pow, slots, first): the
// order PolyMACer's launches pass them in.
func checkPolyParams(t *testing.T, k *ptxKernel, entry string, head ...string) {
	t.Helper()
	var want []string
	for _, p := range append(head, "rs01", "rs23", "rs4", "pow", "slots", "first") {
		want = append(want, entry+"_"+p)
	}
	if k.name != entry || fmt.Sprint(k.params) != fmt.Sprint(want) || k.paramSize[len(want)-1] != 4 {
		t.Fatalf("kernel %s(%v): want %s(%v), first a u32", k.name, k.params, entry, want)
	}
}

// polyTable returns key's table of powers as PolyMACer writes it.
func polyTable(key *mac.PolyKey) []byte {
	raw := make([]byte, polyTableBytes)
	putPolyTable(raw, key)
	return raw
}

// runPolyPTXInto launches the kernel over msg, blocks blk on of a message
// of q blocks, mapped at ptxBufBase+off, on a grid of blocks×threads whose
// blocks run in the order given (nil: 0, 1, ...), adding into slot with
// the parameter first.
func runPolyPTXInto(t *testing.T, k *ptxKernel, slot ptxSumSlot, key *mac.PolyKey, msg []byte, off, blk, q uint64, blocks, threads int, order []int, first bool) {
	t.Helper()
	mem := &ptxMemory{}
	mem.addRegion(ptxBufBase+off, msg, true, "message")
	mem.addRegion(ptxPolyTableBase, polyTable(key), true, "table of powers")
	mem.add(ptxSlotsBase, slot)
	// The parameters as PolyMACer.Queue builds them.
	err := k.runBlocks(mem, blocks, threads, order, polyParams([]uint64{ptxBufBase + off, uint64(len(msg)), blk, q},
		key.Power(uint64(blocks*threads)), ptxPolyTableBase, ptxSlotsBase, ptxFirst(first))...)
	if err != nil {
		t.Fatalf("%d bytes at offset %d, %d×%d threads: %v", len(msg), off, blocks, threads, err)
	}
}

// polySums returns the limb sums of the slot's result words, as
// PendingPolyMAC.Wait adds them, once it has checked that the launch left
// the partials and the ticket zeroed and that no thread added past its
// lane's five words.
func polySums(t *testing.T, slot ptxSumSlot) [5]uint64 {
	t.Helper()
	slot.result(t)
	var sums [5]uint64
	for i := range checksumSlots {
		v := binary.LittleEndian.Uint64(slot[checksumResult+8*i:])
		if i >= 5*polyLanes {
			if v != 0 {
				t.Fatalf("result word %d, past the lanes' partials, is %#x", i, v)
			}
			continue
		}
		sums[i%5] += v
	}
	return sums
}

// TestPolyPTX compares the kernel's tags with mac.PolySum over random
// messages: every size from 0 to 100 bytes, random sizes up to 5000, and
// a few large ones, at 16-byte aligned, 8-byte aligned and unaligned
// addresses, under grids of 1 to 768 threads (more threads than blocks,
// and fewer).
func TestPolyPTX(t *testing.T) {
	k := polyPTXKernel(t)
	rng := rand.New(rand.NewPCG(21, 22))
	grids := [][2]int{{1, 1}, {1, 32}, {3, 64}, {2, 256}, {5, 7}, {3, 256}}
	offs := []uint64{0, 16, 8, 1, 3, 15}
	var sizes []int
	for n := range 101 {
		sizes = append(sizes, n)
	}
	for range 30 {
		sizes = append(sizes, rng.IntN(5000))
	}
	sizes = append(sizes, 4096, 4097, 65536+15, 100000)
	for i, n := range sizes {
		key, nonce := randomPolyKeyNonce(rng)
		msg := make([]byte, n)
		for j := range msg {
			msg[j] = byte(rng.Uint32())
		}
		g, off := grids[i%len(grids)], offs[i%len(offs)]
		if n > 10000 {
			g = [2]int{4, 256}
		}
		slot := newPTXSumSlot()
		runPolyPTXInto(t, k, slot, key, msg, off, 0, mac.PolyBlocks(int64(n)), g[0], g[1], rng.Perm(g[0]), true)
		if got, want := key.Finish(nonce, polySums(t, slot)), mac.PolySum(key, nonce, msg); got != want {
			t.Fatalf("%d bytes at offset %d, %d×%d threads: %s, want %s", n, off, g[0], g[1], got, want)
		}
	}
}

// TestPolyPTXLaunches cuts messages into launches of whole blocks (the
// last one partial) added into one slot, the first with first set and
// the slot holding a former sum: the tag must be the message's.
func TestPolyPTXLaunches(t *testing.T) {
	k := polyPTXKernel(t)
	rng := rand.New(rand.NewPCG(23, 24))
	slot := newPTXSumSlot()
	for i := range 20 {
		n := 1 + rng.IntN(6000)
		key, nonce := randomPolyKeyNonce(rng)
		msg := make([]byte, n)
		for j := range msg {
			msg[j] = byte(rng.Uint32())
		}
		q := mac.PolyBlocks(int64(n))
		at := 0
		for first := true; at < n; first = false {
			end := min(n, at+mac.PolyBlockSize*(1+rng.IntN(200)))
			blocks, threads := 1+rng.IntN(4), 32*(1+rng.IntN(4))
			runPolyPTXInto(t, k, slot, key, msg[at:end], 0, uint64(at/mac.PolyBlockSize), q, blocks, threads, rng.Perm(blocks), first)
			at = end
		}
		if got, want := key.Finish(nonce, polySums(t, slot)), mac.PolySum(key, nonce, msg); got != want {
			t.Fatalf("message %d, %d bytes: %s, want %s", i, n, got, want)
		}
	}
}

// TestPolyPTXSelfTest runs the device self-test's cases (checksumCheck)
// with its key and nonce through the interpreter, so that a self-test
// that would fail on a GPU fails here first.
func TestPolyPTXSelfTest(t *testing.T) {
	k := polyPTXKernel(t)
	pat := make([]byte, checksumCheckSize)
	for i := range pat {
		pat[i] = byte(i*151 + i>>9 + 11)
	}
	for _, cc := range checksumCheck {
		if cc.n > 1<<16 {
			continue // the interpreter's time; TestPolyPTX has large sizes
		}
		msg := pat[cc.off : cc.off+cc.n]
		slot := newPTXSumSlot()
		runPolyPTXInto(t, k, slot, polyCheckKey, msg, uint64(cc.off), 0, mac.PolyBlocks(int64(cc.n)), 2, 256, nil, true)
		if got, want := polyCheckKey.Finish(&polyCheckNonce, polySums(t, slot)), mac.PolySum(polyCheckKey, &polyCheckNonce, msg); got != want {
			t.Fatalf("%d bytes at offset %d: %s, want %s", cc.n, cc.off, got, want)
		}
	}
}

func randomPolyKeyNonce(rng *rand.Rand) (*mac.PolyKey, *mac.Nonce) {
	var kb [mac.PolyKeySize]byte
	var n mac.Nonce
	for i := range kb {
		kb[i] = byte(rng.Uint32())
	}
	for i := range n {
		n[i] = byte(rng.Uint32())
	}
	return mac.NewPolyKey(&kb), &n
}

const (
	ptxPolySrcBase    = 0x7f3000000000
	ptxPolyDstBase    = 0x7f4000000000
	ptxPolyPiecesBase = 0x7f5000000000
)

// polyLayoutCase is a layout for the layout kernel: pieces of a source
// buffer placed in an n-byte message, some copied into a destination
// buffer.
type polyLayoutCase struct {
	n      int
	src    []byte
	dstLen int
	pieces []polyPiece
}

type polyPiece struct{ at, off, len, dst int } // dst -1: only read

// flat returns the message the layout stands for, and the destination
// buffer as the copies leave it.
func (c *polyLayoutCase) flat() (msg, dst []byte) {
	msg, dst = make([]byte, c.n), make([]byte, c.dstLen)
	for _, p := range c.pieces {
		copy(msg[p.at:], c.src[p.off:p.off+p.len])
		if p.dst >= 0 {
			copy(dst[p.dst:], c.src[p.off:p.off+p.len])
		}
	}
	return msg, dst
}

// randomPolyLayout returns a layout of up to pieces pieces at multiples of
// 1024, with gaps, pieces of any length and alignment, the message ending
// in a piece or in padding, about half the pieces copied.
func randomPolyLayout(rng *rand.Rand, pieces, maxLen int) *polyLayoutCase {
	c := &polyLayoutCase{}
	at, off, dst := 0, 0, 0
	for range 1 + rng.IntN(pieces) {
		at += 1024 * rng.IntN(3)
		n := 1 + rng.IntN(maxLen)
		p := polyPiece{at: at, off: off + rng.IntN(17), len: n, dst: -1}
		if rng.IntN(2) == 0 {
			p.dst = dst + []int{0, 16, 3}[rng.IntN(3)]
			dst = p.dst + n
		}
		off = p.off + n
		c.pieces = append(c.pieces, p)
		at = (at + n + 1023) / 1024 * 1024
	}
	last := c.pieces[len(c.pieces)-1]
	c.n = last.at + last.len + rng.IntN(3000)
	c.src = make([]byte, off+16)
	for i := range c.src {
		c.src[i] = byte(rng.Uint32())
	}
	c.dstLen = dst
	return c
}

// runPolyLayoutPTX runs the layout kernel over c, chunks c0 to c1 per
// launch as cuts gives them (nil: one launch), into slot, and returns the
// destination buffer.
func runPolyLayoutPTX(t *testing.T, k *ptxKernel, slot ptxSumSlot, key *mac.PolyKey, c *polyLayoutCase, cuts []uint64, blocks, threads int, rng *rand.Rand) []byte {
	t.Helper()
	dst := make([]byte, c.dstLen)
	chunks := uint64(max(1, (c.n+1023)/1024))
	if cuts == nil {
		cuts = []uint64{0, chunks}
	}
	for li := 0; li+1 < len(cuts); li++ {
		c0, c1 := cuts[li], cuts[li+1]
		// The launch's pieces: those that start in its chunks.
		var desc []byte
		count := 0
		for _, p := range c.pieces {
			if uint64(p.at/1024) < c0 || uint64(p.at/1024) >= c1 {
				continue
			}
			var w [32]byte
			binary.LittleEndian.PutUint64(w[0:], uint64(p.at))
			binary.LittleEndian.PutUint64(w[8:], ptxPolySrcBase+uint64(p.off))
			if p.dst >= 0 {
				binary.LittleEndian.PutUint64(w[16:], ptxPolyDstBase+uint64(p.dst))
			}
			binary.LittleEndian.PutUint64(w[24:], uint64(p.len))
			desc = append(desc, w[:]...)
			count++
		}
		mem := &ptxMemory{}
		mem.addRegion(ptxPolySrcBase, c.src, true, "sources")
		if len(dst) > 0 {
			mem.add(ptxPolyDstBase, dst)
		}
		if count > 0 {
			mem.addRegion(ptxPolyPiecesBase, desc, true, "pieces")
		}
		mem.addRegion(ptxPolyTableBase, polyTable(key), true, "table of powers")
		mem.add(ptxSlotsBase, slot)
		// The parameters as PolyMACer.queueLayout builds them.
		err := k.runBlocks(mem, blocks, threads, rng.Perm(blocks), polyParams([]uint64{ptxPolyPiecesBase, uint64(count), c0, c1, uint64(c.n)},
			key.Power(uint64(blocks*threads)), ptxPolyTableBase, ptxSlotsBase, ptxFirst(li == 0))...)
		if err != nil {
			t.Fatalf("a %d-byte layout of %d pieces, chunks %d to %d, %d×%d threads: %v", c.n, len(c.pieces), c0, c1, blocks, threads, err)
		}
	}
	return dst
}

// TestPolyLayoutPTX compares the layout kernel's tags with mac.PolySum of
// the message the layout stands for, and its copies with their pieces,
// over random layouts in one launch and cut into launches at chunks where
// pieces start (as the splitter cuts them), under grids of 1 to 768
// threads.
func TestPolyLayoutPTX(t *testing.T) {
	k := parsePTX(t, "poly_layout.ptx", polyLayoutPTX)
	checkPolyParams(t, k, "wc_poly_layout", "pieces", "count", "c0", "c1", "n")
	rng := rand.New(rand.NewPCG(25, 26))
	grids := [][2]int{{1, 1}, {1, 32}, {3, 64}, {2, 256}, {5, 7}, {3, 256}}
	for i := range 60 {
		c := randomPolyLayout(rng, 1+i%12, []int{40, 3000, 20000}[i%3])
		key, nonce := randomPolyKeyNonce(rng)
		msg, wantDst := c.flat()
		want := mac.PolySum(key, nonce, msg)
		g := grids[i%len(grids)]
		var cuts []uint64
		if i%2 == 1 {
			// Launch boundaries at pieces' starts, as macLayoutSplitter's
			// slots end: each launch's pieces start in its chunks.
			cuts = []uint64{0}
			for j, p := range c.pieces {
				if j > 0 && rng.IntN(2) == 0 {
					cuts = append(cuts, uint64(p.at/1024))
				}
			}
			cuts = append(cuts, uint64(max(1, (c.n+1023)/1024)))
		}
		slot := newPTXSumSlot()
		dst := runPolyLayoutPTX(t, k, slot, key, c, cuts, g[0], g[1], rng)
		if got := key.Finish(nonce, polySums(t, slot)); got != want {
			t.Fatalf("layout %d (%d bytes, %d pieces, launches at %v, %d×%d threads): %s, want %s", i, c.n, len(c.pieces), cuts, g[0], g[1], got, want)
		}
		if string(dst) != string(wantDst) {
			t.Fatalf("layout %d: the copies did not write their pieces' bytes", i)
		}
	}
}
