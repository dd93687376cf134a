package gpu

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/weightcast/weightcast/checksum"
)

// The tests below run the embedded checksum.ptx on the host, through the
// PTX interpreter of ptx_interp_test.go. The checksummed buffer is mapped
// read-only and exactly n bytes long, so a load of any byte at or past n,
// or a store into the buffer, fails the test (on a GPU such a load reads
// whatever follows, or faults past the allocation). A slot (its partials,
// ticket and result: checksum.go) is a region of exactly its size.

const (
	ptxBufBase   = 0x7f0000000000
	ptxSlotsBase = 0x7f1000000000
)

// runChecksumPTX checksums buf, mapped at ptxBufBase+off, with a grid of
// blocks×threads into a new slot, and returns checksum.Finish of its
// result.
func runChecksumPTX(t *testing.T, k *ptxKernel, buf []byte, off uint64, blocks, threads int) uint64 {
	t.Helper()
	slot := newPTXSumSlot()
	runChecksumPTXInto(t, k, slot, buf, off, blocks, threads, nil, true)
	return checksum.Finish(slot.result(t), int64(len(buf)))
}

// runChecksumPTXInto launches the kernel over buf, mapped at
// ptxBufBase+off, on a grid of blocks×threads whose blocks run in the
// order given (0, 1, ... when order is nil), adding into slot, which it
// maps at ptxSlotsBase, with the parameter first.
func runChecksumPTXInto(t *testing.T, k *ptxKernel, slot ptxSumSlot, buf []byte, off uint64, blocks, threads int, order []int, first bool) {
	t.Helper()
	mem := &ptxMemory{}
	mem.addRegion(ptxBufBase+off, buf, true, "checksummed buffer")
	mem.add(ptxSlotsBase, slot)
	if err := k.runBlocks(mem, blocks, threads, order, ptxBufBase+off, uint64(len(buf)), ptxSlotsBase, ptxFirst(first)); err != nil {
		t.Fatalf("%d bytes at offset %d, %d×%d threads: %v", len(buf), off, blocks, threads, err)
	}
}

func checksumPTXKernel(t *testing.T) *ptxKernel {
	k := parsePTX(t, "checksum.ptx", checksumPTX)
	if k.name != "wc_checksum" || len(k.params) != 4 || k.paramSize[0] != 8 || k.paramSize[1] != 8 || k.paramSize[2] != 8 || k.paramSize[3] != 4 {
		t.Fatalf("kernel %s(%v): want wc_checksum(u64 buf, u64 n, u64 slots, u32 first)", k.name, k.params)
	}
	return k
}

// ptxSumSlot is the slot of a checksum kernel in the interpreter's memory:
// the partials, the ticket and the result words (checksum.go).
type ptxSumSlot []byte

// newPTXSumSlot returns a zeroed slot, as a Checksummer's start.
func newPTXSumSlot() ptxSumSlot { return make(ptxSumSlot, checksumResult+checksumSlotBytes) }

// result returns the sum of the slot's result words, once it has checked
// that the launch left the partials and the ticket zeroed: the slot ready
// for the next launch without a memset.
func (s ptxSumSlot) result(t testing.TB) uint64 {
	t.Helper()
	sum, err := s.sum()
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// sum is result, returning what is wrong rather than failing a test.
func (s ptxSumSlot) sum() (uint64, error) {
	for i, b := range s[:checksumResult] {
		if b != 0 {
			return 0, fmt.Errorf("byte %d of the slot (partials, ticket) is %#x after the launch: the last block did not clear it", i, b)
		}
	}
	var sum uint64
	for i := range checksumSlots {
		sum += binary.LittleEndian.Uint64(s[checksumResult+8*i:])
	}
	return sum, nil
}

// ptxFirst is the kernels' parameter first.
func ptxFirst(first bool) uint64 {
	if first {
		return 1
	}
	return 0
}

// TestChecksumPTXSlotReuse runs sums one after another into one slot, with
// the blocks in random orders (any of them may finish last): a launch with
// first set gives its own sum whatever the slot held, one without adds to
// the result before it, and each leaves the partials and ticket cleared.
func TestChecksumPTXSlotReuse(t *testing.T) {
	k := checksumPTXKernel(t)
	rng := rand.New(rand.NewPCG(15, 16))
	slot := newPTXSumSlot()
	var acc uint64 // the sum of the launches' word contributions since the last first
	for i := range 40 {
		buf := make([]byte, rng.IntN(20000))
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
		blocks, threads := 1+rng.IntN(9), 32*(1+rng.IntN(8))
		first := i == 0 || rng.IntN(3) == 0
		runChecksumPTXInto(t, k, slot, buf, 0, blocks, threads, rng.Perm(blocks), first)
		one := newPTXSumSlot()
		runChecksumPTXInto(t, k, one, buf, 0, blocks, threads, nil, true)
		if first {
			acc = 0
		}
		acc += one.result(t)
		if got := slot.result(t); got != acc {
			t.Fatalf("launch %d (first %v, %d×%d threads): the slot's result is %#x, want %#x", i, first, blocks, threads, got, acc)
		}
		if one.result(t) == 0 && len(buf) > 0 {
			t.Fatalf("launch %d: a sum of %d bytes is 0", i, len(buf))
		}
	}
}

// TestChecksumPTX compares the kernel's sums with checksum.Sum over random
// buffers: every size from 0 to 300 bytes, random sizes up to 5000, and a
// few large ones, at 16-byte aligned, 8-byte aligned and unaligned
// addresses, under grids of 1 to 768 threads (more threads than slots, so
// that threads share slots, and fewer threads than words).
func TestChecksumPTX(t *testing.T) {
	k := checksumPTXKernel(t)
	rng := rand.New(rand.NewPCG(11, 12))
	grids := [][2]int{{1, 1}, {1, 32}, {3, 64}, {2, 256}, {5, 7}, {3, 256}}
	offs := []uint64{0, 8, 1, 3, 4, 12, 15}
	var sizes []int
	for n := range 301 {
		sizes = append(sizes, n)
	}
	for range 60 {
		sizes = append(sizes, rng.IntN(5001))
	}
	sizes = append(sizes, 4096, 4097, 65536+13, 1<<20+5)
	for i, n := range sizes {
		buf := make([]byte, n)
		for j := range buf {
			buf[j] = byte(rng.Uint32())
		}
		want := checksum.Sum(buf)
		g := grids[i%len(grids)]
		off := offs[i%len(offs)]
		if n > 5000 {
			g = [2]int{4, 64}
		}
		if got := runChecksumPTX(t, k, buf, off, g[0], g[1]); got != want {
			t.Fatalf("%d bytes at offset %d, %d×%d threads: kernel gives %#x, checksum.Sum %#x", n, off, g[0], g[1], got, want)
		}
	}
}

// TestChecksumPTXPaths checks which loads the kernel uses: 16-byte loads
// for pairs of words of a 16-byte aligned buffer, one 8-byte load for an
// odd last word and byte loads for the partial last word only; 8-byte
// loads throughout when the buffer is 8-byte aligned; bytes otherwise.
func TestChecksumPTXPaths(t *testing.T) {
	k := checksumPTXKernel(t)
	for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 1000, 1001, 1007} {
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(i*7 + 3)
		}
		words := n / 8
		for _, c := range []struct {
			off           uint64
			v2, u64, u8   int
			alignmentName string
		}{
			{0, words / 2, words % 2, n % 8, "16-byte aligned"},
			{8, 0, words, n % 8, "8-byte aligned"},
			{5, 0, 0, n, "unaligned"},
		} {
			k.resetCounts()
			if got, want := runChecksumPTX(t, k, buf, c.off, 2, 32), checksum.Sum(buf); got != want {
				t.Fatalf("%d bytes, %s: kernel gives %#x, checksum.Sum %#x", n, c.alignmentName, got, want)
			}
			got := [3]int{k.executed("ld.global.v2.u64"), k.executed("ld.global.u64"), k.executed("ld.global.u8")}
			if want := [3]int{c.v2, c.u64, c.u8}; got != want {
				t.Errorf("%d bytes, %s: %d 16-byte, %d 8-byte and %d byte loads, want %v", n, c.alignmentName, got[0], got[1], got[2], want)
			}
			if red := k.executed("red.global.add.u64"); red != 64 {
				t.Errorf("%d bytes, %s: %d slot additions for 64 threads", n, c.alignmentName, red)
			}
		}
	}
}

// TestChecksumPTXReadsOnlyN plants a checksummed buffer inside a larger
// read-only region whose bytes past n differ from zero, and checks that
// the sum does not change with them; together with the exact-size regions
// of the other tests, this shows the kernel neither reads nor depends on
// bytes past n.
func TestChecksumPTXReadsOnlyN(t *testing.T) {
	k := checksumPTXKernel(t)
	rng := rand.New(rand.NewPCG(13, 14))
	for n := range 70 {
		region := make([]byte, (n+15)&^15+16)
		for i := range region {
			region[i] = byte(rng.Uint32())
		}
		want := checksum.Sum(region[:n])
		slot := newPTXSumSlot()
		mem := &ptxMemory{}
		mem.addRegion(ptxBufBase, region, true, "buffer and what follows")
		mem.add(ptxSlotsBase, slot)
		if err := k.run(mem, 1, 32, ptxBufBase, uint64(n), ptxSlotsBase, 1); err != nil {
			t.Fatal(err)
		}
		if got := checksum.Finish(slot.result(t), int64(n)); got != want {
			t.Fatalf("n=%d with garbage after it: %#x, want %#x", n, got, want)
		}
	}
}

// TestChecksumGrid checks the launch geometry: one block for small
// buffers, growing with the size, capped at the device's limit.
func TestChecksumGrid(t *testing.T) {
	for _, c := range []struct {
		n           int64
		max, blocks int
	}{
		{1, 528, 1},
		{checksumThreads * checksumBytesPerThread, 528, 1},
		{checksumThreads*checksumBytesPerThread + 1, 528, 2},
		{1 << 20, 528, (1 << 20) / (checksumThreads * checksumBytesPerThread)},
		{1 << 30, 528, 528},
		{1 << 40, 528, 528},
		{1 << 30, 1, 1},
	} {
		if got := checksumBlocks(c.n, c.max); got != c.blocks {
			t.Errorf("checksumBlocks(%d, %d) = %d, want %d", c.n, c.max, got, c.blocks)
		}
	}
	if checksumThreads != checksumSlots {
		t.Errorf("%d threads per block but %d slots: a warp's threads would not add into distinct slots", checksumThreads, checksumSlots)
	}
}
