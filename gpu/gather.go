package gpu

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/weightcast/weightcast/mem"
)

// gatherPTX is the gather kernel, hand-written PTX with its CUDA C in a
// comment at the top of the file.
//
//go:embed gather.ptx
var gatherPTX string

const (
	// GatherChunk is the most bytes one thread block of the gather kernel
	// copies: Gather splits longer copies into pieces of this size (a
	// multiple of 16, so pieces keep their copy's alignment), so that one
	// long copy spreads over every multiprocessor. On an H200, 64 copies of
	// 16 MiB ran at 1742 GB/s in pieces of 256 KiB, 1734 in pieces of
	// 1 MiB, 1532 in pieces of 64 KiB and 1288 in pieces of 16 KiB
	// (BenchmarkGather64x16MiB; one plain copy of 1 GiB: 1828 GB/s).
	GatherChunk = 256 << 10
	// gatherThreads is the kernel's block size.
	gatherThreads = 256
	// gatherSlotRanges ranges fit in one of the descSlots descriptor
	// slots and are copied by one launch.
	gatherSlotRanges = 8192
	// gatherWords is the size of one range descriptor in uint64 words:
	// src, dst, len, as the kernel reads them.
	gatherWords = 3
	// gatherCheckWait bounds the self-test that runs when the kernel is
	// loaded.
	gatherCheckWait = 10 * time.Second
)

// GatherEnv names the environment variable that turns the gather kernel
// off when set to "off": every Gather then queues its copies with
// Stream.CopyBatch.
const GatherEnv = "WEIGHTCAST_GATHER"

// ErrNoGatherKernel is matched (errors.Is) by the reason Gather gives for
// not using its kernel: the driver lacks a function, the PTX did not
// compile for this GPU, the kernel failed its self-test, or GatherEnv
// turned it off.
var ErrNoGatherKernel = errors.New("gpu: gather kernel unavailable")

// gatherKernel loads the gather kernel into d's context once, and checks
// it on a few copies before anything else may use it.
func (d *CUDADevice) gatherKernel() (*loadedKernel, error) {
	return d.kernels.gather.get(d.loadGather)
}

func (d *CUDADevice) loadGather() (*loadedKernel, error) {
	if v := os.Getenv(GatherEnv); v == "off" {
		return nil, fmt.Errorf("%w: %s=%s", ErrNoGatherKernel, GatherEnv, v)
	}
	// A closed device is the device's error (Kernel returns it as is).
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	k, err := d.loadPTX("gather.ptx", gatherPTX, "wc_gather", ErrNoGatherKernel)
	if err != nil {
		return nil, err
	}
	return d.selfTested(k, d.checkGather(k), ErrNoGatherKernel)
}

// gatherCheck lists the self-test's copies (offsets into 256 KiB buffers,
// split into pieces of gatherCheckChunk): 16-byte aligned with every loop
// of the kernel, piece boundaries and a tail; misaligned; single bytes.
const gatherCheckChunk = 16 << 10

var gatherCheck = []struct{ dst, src, n int }{
	{0, 0, 100005},             // aligned: unrolled, single, byte tail, seven pieces
	{102400, 3, 5000},          // source misaligned: bytes
	{110016, 110000, 7},        // aligned, shorter than 16 bytes
	{120001, 120001, 1},        // one byte, both misaligned alike
	{140000, 130000, 4083},     // aligned, 255 vectors and 3 bytes
	{160000, 150000, 65584},    // aligned, four full pieces and 48 bytes
	{230001, 240000, 16 << 10}, // destination misaligned
}

// checkGather runs the kernel on gatherCheck and compares every byte of
// the destination buffer.
func (d *CUDADevice) checkGather(k *loadedKernel) error {
	return selfTest(d, gatherCheckWait, []int{gatherCheckSize, gatherCheckSize},
		func(s *Stream) *Gather {
			return &Gather{s: s, k: k, chunk: gatherCheckChunk, ring: gatherRanges.ring(), sumRing: gatherSumRanges.ring(), sumLoaded: true}
		},
		runGatherCheck)
}

// gatherCheckSize is the size of the self-test's source and destination.
const gatherCheckSize = 256 << 10

// runGatherCheck copies gatherCheck from bufs[0] to bufs[1] with g, and
// checks every byte of bufs[1].
func runGatherCheck(ctx context.Context, s *Stream, g *Gather, bufs []mem.Buffer) error {
	const n = gatherCheckSize
	src, dst := bufs[0], bufs[1]
	pat := make([]byte, n)
	for i := range pat {
		pat[i] = byte(i*131 + i>>8 + 7)
	}
	want := make([]byte, n)
	var b CopyBatch
	for _, c := range gatherCheck {
		b.Add(dst.DevicePtr()+uint64(c.dst), src.DevicePtr()+uint64(c.src), int64(c.n))
		copy(want[c.dst:c.dst+c.n], pat[c.src:c.src+c.n])
	}
	got := make([]byte, n)
	if err := s.CopyHtoD(src, 0, pat); err != nil {
		return err
	}
	if err := s.Memset(dst, 0, n, 0); err != nil {
		return err
	}
	if err := g.Copy(ctx, &b); err != nil {
		return err
	}
	if err := s.CopyDtoH(got, dst, 0); err != nil {
		return err
	}
	if err := s.Sync(ctx); err != nil {
		return err
	}
	if i := diffAt(got, want); i >= 0 {
		return fmt.Errorf("byte %d of the destination is %#x, want %#x", i, got[i], want[i])
	}
	return nil
}

// diffAt returns the index of the first byte where a and b differ, or -1.
func diffAt(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// GatherPath says how a Gather queued its copies.
type GatherPath int

// The ways Gather queues copies.
const (
	GatherNone      GatherPath = iota // nothing queued yet
	GatherKernel                      // one launch of the gather kernel per up to 8192 pieces
	GatherCopyBatch                   // the kernel is unavailable: Stream.CopyBatch
)

// String names the path for people.
func (p GatherPath) String() string {
	switch p {
	case GatherKernel:
		return "gather kernel"
	case GatherCopyBatch:
		return "CopyBatch (no gather kernel)"
	}
	return "none"
}

var (
	gatherMu       sync.Mutex
	lastGatherPath GatherPath
	lastGatherWhy  error
)

// LastGatherPath reports how the most recent Gather.Copy of this process
// queued its copies and, when that was not the kernel, why (an error
// matching ErrNoGatherKernel).
func LastGatherPath() (GatherPath, error) {
	gatherMu.Lock()
	defer gatherMu.Unlock()
	return lastGatherPath, lastGatherWhy
}

func noteGatherPath(p GatherPath, why error) {
	gatherMu.Lock()
	lastGatherPath, lastGatherWhy = p, why
	gatherMu.Unlock()
}

// Gather queues many copies between device addresses of one GPU with one
// launch of a small copy kernel, instead of one copy-engine operation per
// copy (about 4 µs each on an H200, batched or not; the kernel took 0.011 µs
// per 4 KiB copy, BenchmarkGather4KiB). The kernel runs one
// thread block per piece of at most GatherChunk bytes, with 16-byte loads
// and stores where source, destination and length allow, byte copies
// elsewhere.
//
// The range descriptors (source, destination, length: 24 bytes each) are
// written to pinned host memory, copied to device memory and read by the
// kernel, all on the stream, through a ring of four slots of 8192 ranges;
// a slot is rewritten only after the launch that read it has finished
// (Copy waits for that, bounded by its context).
//
// Where the kernel cannot be used (see NewGather), Copy queues the copies
// with Stream.CopyBatch instead; Kernel and LastGatherPath say which. A
// Gather is not safe for concurrent use. Close it before closing its
// stream.
//
// Unlike the copy engine, which refuses a copy outside live memory with
// an error, the kernel faults on it, and a fault ends the CUDA context of
// the process: callers hand Gather only ranges they have checked to lie
// inside allocations.
type Gather struct {
	s     *Stream
	k     *loadedKernel // nil: copies go through CopyBatch
	why   error         // why k is nil
	chunk uint64        // GatherChunk; tests and benchmarks try others
	ring  descRing      // of gatherRanges; its memory taken at first use

	// The fused gather and checksum kernel of CopySum (gather_sum.go),
	// loaded at first use (sumLoaded), or why it is unavailable, and its
	// ring of gatherSumRanges.
	sumK      *loadedKernel
	sumWhy    error
	sumLoaded bool
	sumRing   descRing
	sumPerSM  int // the fused kernel's blocks per multiprocessor; 0: gatherSumBlocksPerSM
}

// maxSpareGather bounds the descriptor memories a device keeps for later
// Gathers (one per concurrent Gather is enough; each is 1.5 MiB).
const maxSpareGather = 4

// gatherRanges are the descriptors of the gather kernel: source,
// destination, length.
var gatherRanges = descKind{
	name:      "gather",
	unit:      "ranges",
	words:     gatherWords,
	threads:   gatherThreads,
	slotDescs: gatherSlotRanges,
	maxSpare:  maxSpareGather,
	spares:    func(d *CUDADevice) *descSpares { return &d.kernels.gatherSpare },
}

// NewGather returns a Gather that queues copies on s. The first Gather of
// a device loads the kernel (the driver compiles its PTX, a few
// milliseconds) and checks it on a few copies; where that fails, or the
// driver lacks cuLaunchKernel or cuModuleLoadData, or GatherEnv is "off",
// every Gather of the device falls back to Stream.CopyBatch, and Kernel
// returns the reason.
func (s *Stream) NewGather() *Gather {
	g := &Gather{s: s, chunk: GatherChunk, ring: gatherRanges.ring(), sumRing: gatherSumRanges.ring()}
	g.k, g.why = s.d.gatherKernel()
	if g.k == nil && g.why == nil {
		g.why = ErrNoGatherKernel
	}
	return g
}

// Kernel reports whether Copy uses the gather kernel and, if not, why (an
// error matching ErrNoGatherKernel, or the device's error).
func (g *Gather) Kernel() (bool, error) { return g.k != nil, g.why }

// Copy queues every copy of b on the stream, then empties b. Sources and
// destinations must be device memory of the stream's GPU (its own
// allocations, views of them, or IPC mappings opened on it), copies must
// not overlap, and they may run in any order. As with CopyBatch, the
// sources must stay unchanged until an Event recorded after Copy has
// completed. Copy blocks only to reuse a descriptor slot whose launch is
// still running, at most until ctx ends.
func (g *Gather) Copy(ctx context.Context, b *CopyBatch) error {
	if g.k == nil {
		noteGatherPath(GatherCopyBatch, g.why)
		return g.s.CopyBatch(b)
	}
	defer b.Reset()
	if err := g.s.check(); err != nil {
		return err
	}
	if b.Len() == 0 {
		return nil
	}
	if err := g.ring.alloc(g.s); err != nil {
		return err
	}
	noteGatherPath(GatherKernel, nil)
	return g.ring.queue(ctx, g.s, g.k, &rangeSplitter{b: b, chunk: g.chunk})
}

// Close waits, bounded by ctx, until no launch reads the descriptor
// memory any more, then gives it back to the device for later Gathers
// (the device frees it on Close) or frees it. If the wait fails the memory
// stays allocated (rather than be reused under a running copy) and Close
// returns the error. Close is idempotent.
func (g *Gather) Close(ctx context.Context) error {
	return errors.Join(g.ring.close(ctx, g.s), g.sumRing.close(ctx, g.s))
}

// rangeSplitter walks the copies of a CopyBatch as kernel ranges of at
// most chunk bytes each (a multiple of 16, so that every piece keeps the
// alignment of its copy): it stands at byte off of copy i.
type rangeSplitter struct {
	b     *CopyBatch
	chunk uint64
	i     int
	off   uint64
}

// done reports whether every byte of b has been handed out.
func (sp *rangeSplitter) done() bool { return sp.i >= len(sp.b.sizes) }

// fill writes the next ranges of b into out, gatherWords words each
// (source, destination, length), until out is full or b is done, and
// returns how many it wrote.
func (sp *rangeSplitter) fill(out []uint64) int {
	b := sp.b
	n := 0
	for ; (n+1)*gatherWords <= len(out) && sp.i < len(b.sizes); n++ {
		size := b.sizes[sp.i]
		m := min(sp.chunk, size-sp.off)
		w := out[n*gatherWords : (n+1)*gatherWords]
		w[0], w[1], w[2] = b.srcs[sp.i]+sp.off, b.dsts[sp.i]+sp.off, m
		sp.off += m
		if sp.off == size {
			sp.i, sp.off = sp.i+1, 0
		}
	}
	return n
}
