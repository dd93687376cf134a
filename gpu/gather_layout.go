package gpu

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/mem"
)

// gatherLayoutPTX is the kernel of Gather.CopySumLayout, hand-written PTX
// with its CUDA C in a comment at the top of the file.
//
//go:embed gather_layout.ptx
var gatherLayoutPTX string

const (
	// gatherLayoutWords is the size of one range of the layout kernel in
	// uint64 words: src, dst, len, sum, at and one unused, so that ranges
	// stay 16-byte aligned for the kernel's vector loads.
	gatherLayoutWords = 6
	// gatherLayoutSlotRanges ranges fit in one descriptor slot.
	gatherLayoutSlotRanges = 8192
	// gatherLayoutExtend bounds the zero bytes after a piece (up to the
	// next piece) that the piece's last range sums; longer runs of zeros
	// get ranges of their own.
	gatherLayoutExtend = 256
	// gatherLayoutBlocksPerSM caps the kernel's grid at this many blocks
	// per multiprocessor, as the checksum kernel's; its blocks stride over
	// the ranges, and each thread adds its sum into the slots once.
	gatherLayoutBlocksPerSM = 8
	// gatherLayoutCheckWait bounds the self-test that runs when the kernel
	// is loaded.
	gatherLayoutCheckWait = 10 * time.Second
	// layoutHostChunk is the most bytes the host fallback reads back at a
	// time.
	layoutHostChunk = 16 << 20
)

// GatherLayoutEnv names the environment variable that turns the layout
// kernel off when set to "off": Gather.CopySumLayout then copies
// (Gather.Copy) and sums the layout on the host, reading every piece back.
const GatherLayoutEnv = "WEIGHTCAST_GATHER_LAYOUT"

// ErrNoGatherLayoutKernel is matched (errors.Is) by the reason
// Gather.LayoutKernel gives for not using the layout kernel: the driver
// lacks a function, the PTX did not compile for this GPU, the kernel
// failed its self-test, or GatherLayoutEnv turned it off.
var ErrNoGatherLayoutKernel = errors.New("gpu: gather and layout checksum kernel unavailable")

// Layout places pieces of device memory in a virtual buffer of its own,
// the layout, whose every other byte is zero: piece k's n bytes, read at
// its source address, are the layout's bytes [at, at+n). A piece may also
// be copied to a destination on the way. Gather.CopySumLayout computes
// checksum.Sum of the layout while it copies: a bucket's checksum when the
// pieces are the tensors the bucket would hold (at their entries' offsets)
// and the bucket's padding is zero, without the bucket ever being filled.
// The zero value is an empty layout.
type Layout struct {
	srcs, dsts, sizes, at []uint64
}

// Add places n bytes read at src at byte at of the layout (a multiple of
// 8), and copies them to dst on the way unless dst is 0. Pieces of no
// bytes are dropped.
func (l *Layout) Add(at int64, src uint64, n int64, dst uint64) {
	if n <= 0 {
		return
	}
	l.srcs = append(l.srcs, src)
	l.dsts = append(l.dsts, dst)
	l.sizes = append(l.sizes, uint64(n))
	l.at = append(l.at, uint64(at))
}

// copies returns the copies of l's pieces that have a destination.
func (l *Layout) copies() *CopyBatch {
	var cb CopyBatch
	for i := range l.sizes {
		if l.dsts[i] != 0 {
			cb.Add(l.dsts[i], l.srcs[i], int64(l.sizes[i]))
		}
	}
	return &cb
}

// Len is the number of pieces placed.
func (l *Layout) Len() int { return len(l.sizes) }

// Reset empties l, keeping its memory.
func (l *Layout) Reset() {
	l.srcs, l.dsts, l.sizes, l.at = l.srcs[:0], l.dsts[:0], l.sizes[:0], l.at[:0]
}

// gatherLayoutRanges are the descriptors of the layout kernel.
var gatherLayoutRanges = descKind{
	name:      "gather and layout checksum",
	unit:      "ranges",
	words:     gatherLayoutWords,
	threads:   gatherThreads,
	slotDescs: gatherLayoutSlotRanges,
	maxSpare:  maxSpareGather,
	spares:    func(d *CUDADevice) *descSpares { return &d.kernels.layoutSpare },
}

// gatherLayoutKernel loads the layout kernel into d's context once, and
// checks it before anything else may use it.
func (d *CUDADevice) gatherLayoutKernel() (*loadedKernel, error) {
	return d.kernels.gatherLayout.get(d.loadGatherLayout)
}

func (d *CUDADevice) loadGatherLayout() (*loadedKernel, error) {
	if v := os.Getenv(GatherLayoutEnv); v == "off" {
		return nil, fmt.Errorf("%w: %s=%s", ErrNoGatherLayoutKernel, GatherLayoutEnv, v)
	}
	if _, err := d.Multiprocessors(); err != nil {
		return nil, fmt.Errorf("%w on %s: %w", ErrNoGatherLayoutKernel, d.Name(), err)
	}
	k, err := d.loadPTX("gather_layout.ptx", gatherLayoutPTX, "wc_gather_layout", ErrNoGatherLayoutKernel)
	if err != nil {
		return nil, err
	}
	return d.selfTested(k, d.checkGatherLayout(k), ErrNoGatherLayoutKernel)
}

// gatherLayoutCheck lists the self-test's layouts, between two buffers of
// gatherCheckSize bytes: pieces read from the first (source offset, layout
// position, size, and whether the piece is copied into the second at the
// same offset) in layouts of n bytes, in pieces of gatherCheckChunk bytes:
// aligned and misaligned sources, pieces that end mid-word, runs of zeros
// shorter and longer than gatherLayoutExtend, pieces only summed, out of
// order.
var gatherLayoutCheck = []struct {
	n      int
	pieces [][4]int // source offset, at, size, copied (1) or only summed (0)
}{
	{100001, [][4]int{{0, 0, 40000, 1}, {50000, 40000, 13, 1}, {60001, 40064, 100, 1}, {80000, 41000, 59001, 1}}},
	{7, [][4]int{{16, 0, 5, 1}}},
	{70000, [][4]int{{128, 64, 4083, 0}, {160000, 65536, 4000, 1}}},
	{150003, [][4]int{{200000, 100096, 49907, 1}, {3, 0, 17, 0}, {0, 64, 100000, 0}}},
	{5000, nil},
}

// checkGatherLayout runs the kernel on gatherLayoutCheck and compares
// every byte copied and every sum with the host's (checkSummingGather).
func (d *CUDADevice) checkGatherLayout(k *loadedKernel) error {
	return d.checkSummingGather(gatherLayoutCheckWait, func(s *Stream) *Gather {
		return &Gather{s: s, chunk: gatherCheckChunk, ring: gatherRanges.ring(), sumRing: gatherSumRanges.ring(),
			layK: k, layLoaded: true, layRing: gatherLayoutRanges.ring()}
	}, "layout", len(gatherLayoutCheck), queueGatherLayoutCheck)
}

// queueGatherLayoutCheck queues case ci of gatherLayoutCheck from bufs[0]
// into bufs[1] (a gatherCase); the sum is that of the layout, which
// lives on no buffer.
func queueGatherLayoutCheck(ctx context.Context, t gatherSumTest, bufs []mem.Buffer, ci int, host [2][]byte) (
	*PendingSum, []byte, int, error) {
	c := gatherLayoutCheck[ci]
	src, dst := bufs[0], bufs[1]
	from, want := host[0], host[1]
	var l Layout
	layout := make([]byte, c.n)
	for _, p := range c.pieces {
		o, at, n := p[0], p[1], p[2]
		var to uint64
		if p[3] == 1 {
			to = dst.DevicePtr() + uint64(o)
			copy(want[o:o+n], from[o:o+n])
		}
		l.Add(int64(at), src.DevicePtr()+uint64(o), int64(n), to)
		copy(layout[at:at+n], from[o:o+n])
	}
	ps, err := t.g.CopySumLayout(ctx, &l, int64(c.n), t.c)
	return ps, layout, 1, err
}

// LayoutKernel reports whether CopySumLayout sums the layout as it copies
// (one pass over the pieces) and, if not, why (an error matching
// ErrNoGatherLayoutKernel, or the device's error). The first call of a
// device loads and checks the kernel.
func (g *Gather) LayoutKernel() (bool, error) {
	g.loadLayout()
	return g.layK != nil, g.layWhy
}

// loadLayout loads the layout kernel for g, once.
func (g *Gather) loadLayout() {
	if g.layLoaded {
		return
	}
	g.layLoaded = true
	g.layRing = gatherLayoutRanges.ring()
	g.layK, g.layWhy = g.s.d.gatherLayoutKernel()
	if g.layK == nil && g.layWhy == nil {
		g.layWhy = ErrNoGatherLayoutKernel
	}
}

// CopySumLayout queues the copies of l's pieces that have a destination
// on the stream, as Copy does, together with checksum.Sum of the n-byte
// layout l describes (pieces at their positions, zeros elsewhere), read
// once the stream has run everything queued before. It empties l.
//
// Pieces must start on 8-byte words of the layout, lie inside its n bytes
// and not overlap there; their sources and destinations must be device
// memory the stream's GPU can address (its allocations, views of them, IPC
// mappings opened on it) and copies must not overlap. Where the layout
// kernel can be used (LayoutKernel) and sums is a Checksummer of the
// Gather's stream, the sum costs no pass over memory of its own: the
// kernel hashes each word as it copies it (or, for a piece without a
// destination, as it reads it), and the zeros are hashed without being
// read. Elsewhere (sums nil, or no kernel) CopySumLayout copies with Copy,
// then reads every piece back to the host once the copies have run and
// sums the layout there: the same value, slower. The sources must stay
// unchanged until the PendingSum's Wait has returned. Like Copy,
// CopySumLayout blocks only to rewrite descriptors that a queued launch
// still reads, at most until ctx ends.
func (g *Gather) CopySumLayout(ctx context.Context, l *Layout, n int64, sums *Checksummer) (*PendingSum, error) {
	defer l.Reset()
	d := g.s.d
	if sums != nil && sums.s != g.s {
		return nil, fmt.Errorf("gpu: layout checksum on cuda:%d: the Checksummer must be one of the Gather's stream", d.ordinal)
	}
	if err := g.s.check(); err != nil {
		return nil, err
	}
	sp, err := newLayoutSplitter(l, uint64(n), g.piece(n))
	if err != nil {
		return nil, fmt.Errorf("gpu: layout checksum of %d bytes on cuda:%d: %w", n, d.ordinal, err)
	}
	if g.loadLayout(); g.layK == nil || sums == nil {
		return g.copySumLayoutOnHost(ctx, sp, sums)
	}
	if n == 0 {
		return &PendingSum{knownResult(checksum.Finish(0, 0), 0)}, nil
	}
	if sums.slots.closed {
		return nil, fmt.Errorf("%w: CopySumLayout on cuda:%d", ErrChecksummerClosed, d.ordinal)
	}
	if err := g.layRing.alloc(g.s); err != nil {
		return nil, err
	}
	sms, err := d.Multiprocessors()
	if err != nil {
		return nil, err
	}
	noteGatherPath(GatherKernel, nil)
	return sums.queue(n, func(sl *sumSlot) error {
		return g.layRing.queueWith(ctx, g.s, sp, func(dev uint64, count int) error {
			blocks := min(count, max(1, sms*gatherLayoutBlocksPerSM))
			slots, first := sl.next()
			if err := g.s.launch(g.layK, blocks, gatherThreads, dev, uint64(count), slots, first); err != nil {
				return fmt.Errorf("gather and layout checksum kernel over %d ranges: %w", count, err)
			}
			return nil
		})
	})
}

// copySumLayoutOnHost is CopySumLayout without the kernel: the copies
// through Copy, then every piece read back to the host in order of
// position, and the layout summed there.
func (g *Gather) copySumLayoutOnHost(ctx context.Context, sp *layoutSplitter, sums *Checksummer) (*PendingSum, error) {
	l := sp.l
	if err := g.Copy(ctx, l.copies()); err != nil {
		return nil, err
	}
	var dg checksum.Digest
	zeros := make([]byte, 4096)
	pos := uint64(0)
	fill := func(to uint64) {
		for pos < to {
			k := min(uint64(len(zeros)), to-pos)
			dg.Write(zeros[:k])
			pos += k
		}
	}
	var buf []byte
	for k := range l.sizes {
		c := sp.copyAt(k)
		fill(l.at[c])
		for off := uint64(0); off < l.sizes[c]; {
			m := min(uint64(layoutHostChunk), l.sizes[c]-off)
			if uint64(len(buf)) < m {
				buf = make([]byte, m)
			}
			// Go memory: the copy has landed when the call returns,
			// after everything queued on the stream before.
			if err := g.s.CopyDtoHPtr(buf[:m], l.srcs[c]+off); err != nil {
				return nil, err
			}
			dg.Write(buf[:m])
			off += m
		}
		pos += l.sizes[c]
	}
	fill(sp.n)
	return &PendingSum{knownResult(dg.Sum64(), int64(sp.n))}, nil
}

// layoutSplitter walks a Layout's pieces in the order of their positions
// as the layout kernel's ranges: pieces of at most chunk bytes (a multiple
// of 16, so that pieces keep their alignment) with, on the last range of
// each piece, the zeros up to the next piece's word (and on to the next
// piece when that is at most gatherLayoutExtend away), and ranges of zeros
// only for longer runs, before the first piece and after the last. It
// stands at byte off of the piece order[i] (or l's piece i when order is
// nil); the ranges handed out cover the layout below pos.
type layoutSplitter struct {
	l     *Layout
	order []int
	n     uint64
	chunk uint64

	i   int
	off uint64
	pos uint64
}

// newLayoutSplitter checks l's pieces against an n-byte layout (inside it,
// starting on its words, not overlapping) and returns their splitter.
func newLayoutSplitter(l *Layout, n, chunk uint64) (*layoutSplitter, error) {
	sp := &layoutSplitter{l: l, n: n, chunk: chunk}
	sorted := true
	for i := range l.sizes {
		at, size := l.at[i], l.sizes[i]
		if at > n || size > n-at {
			return nil, fmt.Errorf("piece %d (%d bytes at %d) is not inside the %d-byte layout", i, size, at, n)
		}
		if at%8 != 0 {
			return nil, fmt.Errorf("piece %d starts at byte %d of the layout, not on an 8-byte word", i, at)
		}
		if i > 0 && at < l.at[i-1] {
			sorted = false
		}
	}
	if !sorted {
		sp.order = make([]int, len(l.sizes))
		for i := range sp.order {
			sp.order[i] = i
		}
		slices.SortFunc(sp.order, func(x, y int) int { return cmp.Compare(l.at[x], l.at[y]) })
	}
	for k := 1; k < len(l.sizes); k++ {
		prev, cur := sp.copyAt(k-1), sp.copyAt(k)
		if l.at[prev]+l.sizes[prev] > l.at[cur] {
			return nil, fmt.Errorf("pieces %d and %d overlap in the layout", prev, cur)
		}
	}
	return sp, nil
}

// copyAt returns the index in l of the k-th piece in layout order.
func (sp *layoutSplitter) copyAt(k int) int {
	if sp.order == nil {
		return k
	}
	return sp.order[k]
}

// done reports whether every piece and every byte of the layout has been
// handed out.
func (sp *layoutSplitter) done() bool { return sp.i >= len(sp.l.sizes) && sp.pos >= sp.n }

// fill writes the next ranges into out, gatherLayoutWords words each (src,
// dst, len, sum, at, 0), until out is full or the splitter is done, and
// returns how many it wrote.
func (sp *layoutSplitter) fill(out []uint64) int {
	l := sp.l
	k := 0
	put := func(src, dst, n, sum, at uint64) {
		w := out[k*gatherLayoutWords : (k+1)*gatherLayoutWords]
		w[0], w[1], w[2], w[3], w[4], w[5] = src, dst, n, sum, at, 0
		k++
	}
	for (k+1)*gatherLayoutWords <= len(out) && !sp.done() {
		next := sp.n // where the next piece starts
		if sp.i < len(l.sizes) {
			next = l.at[sp.copyAt(sp.i)]
		}
		if sp.off == 0 && sp.pos < next {
			// Zeros no piece's last range takes: ranges that read nothing.
			m := min(sp.chunk, next-sp.pos)
			put(0, 0, 0, m, sp.pos)
			sp.pos += m
			continue
		}
		c := sp.copyAt(sp.i)
		size := l.sizes[c]
		m := min(sp.chunk, size-sp.off)
		start := l.at[c] + sp.off
		sum := m
		if sp.off+m == size {
			// The piece's last range sums the zeros to the next word, and
			// on to the next piece or the end when that is near.
			end := min((start+m+7)&^7, sp.n)
			after := sp.n
			if sp.i+1 < len(l.sizes) {
				after = l.at[sp.copyAt(sp.i+1)]
			}
			if after-end <= gatherLayoutExtend {
				end = after
			}
			sum = end - start
			sp.pos = end
		}
		var dst uint64
		if l.dsts[c] != 0 {
			dst = l.dsts[c] + sp.off
		}
		put(l.srcs[c]+sp.off, dst, m, sum, start)
		if sp.off += m; sp.off == size {
			sp.i, sp.off = sp.i+1, 0
		}
	}
	return k
}
