package gpu

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mem"
)

// castPTX is the cast kernel, hand-written PTX with its CUDA C in a
// comment at the top of the file.
//
//go:embed cast.ptx
var castPTX string

const (
	// CastChunk is the most elements one thread block of the cast kernel
	// converts: Caster splits longer conversions into pieces of this many
	// elements (a multiple of 4, so pieces keep their conversion's
	// alignment), so that one long tensor spreads over every
	// multiprocessor (BenchmarkCast1GiB; docs/benchmarks.md).
	CastChunk = 1 << 16
	// castThreads is the kernel's block size.
	castThreads = 256
	// castSlotDescs descriptors fit in one of the descSlots descriptor
	// slots and are converted by one launch.
	castSlotDescs = 2048
	// castWords is the size of one descriptor in uint64 words: src, dst,
	// elems, kind, as the kernel reads them.
	castWords = 4
	// castCheckWait bounds the self-test that runs when the kernel is
	// loaded.
	castCheckWait = 10 * time.Second
	// maxSpareCast bounds the descriptor memories a device keeps for later
	// Casters (each is 256 KiB of pinned and 256 KiB of device memory).
	maxSpareCast = 4
)

// CastEnv names the environment variable that turns the cast kernel off
// when set to "off": Caster.Add then fails with ErrNoCastKernel, and
// callers convert on the host (package cast).
const CastEnv = "WEIGHTCAST_GPU_CAST"

// ErrNoCastKernel is matched (errors.Is) by the errors of a Caster whose
// kernel cannot be used: the driver lacks a function, the PTX did not
// compile for this GPU, the kernel failed its self-test, or CastEnv turned
// it off. The error says which.
var ErrNoCastKernel = errors.New("gpu: cast kernel unavailable")

// castCode is the kernel's code of a dtype; 0 for those it does not take.
func castCode(d dtype.DType) uint64 {
	switch d {
	case dtype.F32:
		return 1
	case dtype.BF16:
		return 2
	case dtype.F16:
		return 3
	}
	return 0
}

// castKernel loads the cast kernel into d's context once, and checks it
// before anything else may use it.
func (d *CUDADevice) castKernel() (*loadedKernel, error) {
	return d.kernels.cast.get(d.loadCast)
}

func (d *CUDADevice) loadCast() (*loadedKernel, error) {
	if v := os.Getenv(CastEnv); v == "off" {
		return nil, fmt.Errorf("%w: %s=%s", ErrNoCastKernel, CastEnv, v)
	}
	k, err := d.loadPTX("cast.ptx", castPTX, "wc_cast", ErrNoCastKernel)
	if err != nil {
		return nil, err
	}
	return d.selfTested(k, d.checkCast(k), ErrNoCastKernel)
}

// castCheckCase is one conversion of the self-test: n elements from
// byte srcOff of the source buffer to byte dstOff of the destination.
type castCheckCase struct {
	from, to       dtype.DType
	srcOff, dstOff int
	n              int
}

// castCheckSource returns the self-test's source bytes: every 16-bit
// value in order, then castCheckF32 float32 bit patterns (edge cases, then
// pseudo-random ones), and the conversions that read them: all 65,536
// inputs of each conversion from a 16-bit type, the float32 ones to BF16
// and F16, aligned (groups of four) and misaligned (one element at a
// time), with partial last groups and pieces of castCheckChunk elements.
func castCheckSource() ([]byte, []castCheckCase) {
	const f32At = 2 << 16
	src := make([]byte, f32At+4*castCheckF32)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(src[2*i:], uint16(i))
	}
	f32 := append([]uint32(nil), castEdgeF32...)
	rng := rand.New(rand.NewPCG(1, 2))
	for len(f32) < castCheckF32 {
		f32 = append(f32, rng.Uint32())
	}
	for i, v := range f32 {
		binary.LittleEndian.PutUint32(src[f32At+4*i:], v)
	}
	cases := []castCheckCase{
		{dtype.BF16, dtype.F16, 0, 0, 1 << 16},
		{dtype.F16, dtype.BF16, 0, 2, 1 << 16},
		{dtype.BF16, dtype.F32, 0, 0, 1 << 16},
		{dtype.F16, dtype.F32, 0, 0, 1 << 16},
		{dtype.F16, dtype.F32, 2, 4, 1<<16 - 1},
		{dtype.F32, dtype.BF16, f32At, 0, castCheckF32},
		{dtype.F32, dtype.F16, f32At, 0, castCheckF32},
		{dtype.F32, dtype.F16, f32At + 4, 2, castCheckF32 - 2},
		{dtype.F32, dtype.F32, f32At, 4, 1001},
		{dtype.BF16, dtype.BF16, 0, 6, 1 << 16},
		{dtype.F16, dtype.F16, 0, 0, 1 << 16},
	}
	return src, cases
}

// castCheckF32 is the number of float32 inputs of the self-test, not a
// multiple of four.
const castCheckF32 = 10003

// castCheckChunk is the piece size of the self-test, so that conversions
// span several pieces.
const castCheckChunk = 4096

// castEdgeF32 lists float32 inputs at the edges of the conversions: ties
// to even both ways, NaNs with payloads and both signs, infinities, the
// largest finite values, overflow to Inf, subnormals, underflow to zero.
var castEdgeF32 = []uint32{
	0x00000000, 0x80000000, 0x3F800000, 0xBF800000,
	0x3F807FFF, 0x3F808000, 0x3F818000, 0x3F808001, 0xBF818000, // BF16 rounding
	0x7F7F0000, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7FFFFF, // BF16 overflow
	0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC12345, 0xFFFFFFFF, 0x7F807FFF, 0xFF800001,
	0x00000001, 0x00008000, 0x00008001, 0x00018000, 0x007FFFFF, 0x80018000, 0x807FFFFF, // f32 subnormals
	0x3F801000, 0x3F803000, 0x3F801001, 0x3F800FFF, // F16 rounding
	0x477FE000, 0x477FEFFF, 0x477FF000, 0xC77FF000, 0x477FF001, 0x47800000, 0x501502F9, // F16 overflow
	0x38800000, 0x387FC000, 0x387FE000, 0x387FF000, 0x33800000, 0xB3800000, 0x33000000, 0x33000001,
	0x33C00000, 0x34200000, 0x32FFFFFF, 0x2F800000, 0x34000000, 0x34400000, 0x38000000, // F16 subnormals, underflow
}

// castCheckLayout places each case's output in the destination buffer,
// 256-byte aligned plus the case's dstOff, and returns the offsets and the
// buffer's size.
func castCheckLayout(cases []castCheckCase) (offs []int, size int) {
	for _, c := range cases {
		offs = append(offs, size+c.dstOff)
		size += (c.dstOff + c.n*c.to.Size() + 255) &^ 255
	}
	return offs, size
}

// checkCast runs the kernel on castCheckSource's conversions and compares
// every output byte with cast.Convert.
func (d *CUDADevice) checkCast(k *loadedKernel) error {
	host, cases := castCheckSource()
	offs, size := castCheckLayout(cases)
	check := func(ctx context.Context, s *Stream, c *Caster, bufs []mem.Buffer) error {
		src, dst := bufs[0], bufs[1]
		if err := s.CopyHtoD(src, 0, host); err != nil {
			return err
		}
		if err := s.Memset(dst, 0, size, 0xA5); err != nil {
			return err
		}
		for i, cc := range cases {
			if err := c.Add(dst.DevicePtr()+uint64(offs[i]), src.DevicePtr()+uint64(cc.srcOff), int64(cc.n), cc.from, cc.to); err != nil {
				return err
			}
		}
		if err := c.Flush(ctx); err != nil {
			return err
		}
		got := make([]byte, size)
		if err := s.CopyDtoH(got, dst, 0); err != nil {
			return err
		}
		if err := s.Sync(ctx); err != nil {
			return err
		}
		for i, cc := range cases {
			want := make([]byte, cc.n*cc.to.Size())
			if err := cast.Convert(want, cc.to, host[cc.srcOff:cc.srcOff+cc.n*cc.from.Size()], cc.from); err != nil {
				return err
			}
			if j := diffAt(got[offs[i]:offs[i]+len(want)], want); j >= 0 {
				e := j / cc.to.Size()
				return fmt.Errorf("%s to %s: element %d (byte %d of %d) differs: got % x, want % x", cc.from, cc.to, e, j, len(want),
					got[offs[i]+e*cc.to.Size():offs[i]+(e+1)*cc.to.Size()], want[e*cc.to.Size():(e+1)*cc.to.Size()])
			}
		}
		return nil
	}
	return selfTest(d, castCheckWait, []int{len(host), size},
		func(s *Stream) *Caster { return &Caster{s: s, k: k, chunk: castCheckChunk, ring: castDescs.ring()} },
		check)
}

// Caster converts tensors between F32, BF16 and F16 in device memory with
// a hand-written kernel that reproduces package cast bit for bit. Add
// collects conversions; Flush queues them on the stream, one thread block
// per piece of at most CastChunk elements, any number of conversions per
// launch.
//
// The descriptors (source, destination, element count, kind: 32 bytes
// each) are written to pinned host memory, copied to device memory and
// read by the kernel, all on the stream, through a ring of four slots of
// 2048 descriptors; a slot is rewritten only after the launch that read it
// has finished (Flush waits for that, bounded by its context).
//
// A Caster is not safe for concurrent use. Close it before closing its
// stream. As with Gather, the kernel faults on memory outside live
// allocations, which ends the CUDA context of the process: callers hand
// Caster only ranges they have checked.
type Caster struct {
	s     *Stream
	k     *loadedKernel // nil: Add fails with why
	why   error
	chunk int64 // CastChunk; tests try others

	ops  []castOp // added, not yet flushed
	ring descRing // of castDescs; its memory taken at first Flush
}

// castOp is one conversion that Add accepted.
type castOp struct {
	dst, src uint64
	elems    int64
	sb, db   uint64 // bytes per source and destination element
	kind     uint64 // from | to << 8
}

// castDescs are the descriptors of the cast kernel: source, destination,
// elements, kind.
var castDescs = descKind{
	name:      "cast",
	unit:      "descriptors",
	words:     castWords,
	threads:   castThreads,
	slotDescs: castSlotDescs,
	maxSpare:  maxSpareCast,
	spares:    func(d *CUDADevice) *descSpares { return &d.kernels.castSpare },
}

// NewCaster returns a Caster that queues conversions on s. The first
// Caster of a device loads the kernel (the driver compiles its PTX) and
// checks it against cast.Convert on every 16-bit input of each conversion
// from BF16 or F16 and on edge and random float32 inputs; where that
// fails, the driver lacks a function, or CastEnv is "off", Kernel says why
// and Add fails with an error matching ErrNoCastKernel.
func (s *Stream) NewCaster() *Caster {
	c := &Caster{s: s, chunk: CastChunk, ring: castDescs.ring()}
	c.k, c.why = s.d.castKernel()
	if c.k == nil && c.why == nil {
		c.why = ErrNoCastKernel
	}
	return c
}

// Kernel reports whether the cast kernel is usable and, if not, why (an
// error matching ErrNoCastKernel).
func (c *Caster) Kernel() (bool, error) { return c.k != nil, c.why }

// Add collects a conversion of elems elements of type from at the device
// address src into elems elements of type to at dst; Flush queues it. The
// pairs are those of cast.Supported: F32→BF16, F32→F16, BF16↔F16,
// BF16→F32, F16→F32 and the identities (a copy). Addresses are device
// memory of the stream's GPU, aligned to their element size, and the
// source and destination ranges must not overlap (unlike cast.Convert,
// the kernel cannot convert in place: its threads would overwrite
// elements other threads have not read yet). Add never touches the GPU.
func (c *Caster) Add(dst, src uint64, elems int64, from, to dtype.DType) error {
	if c.k == nil {
		return fmt.Errorf("gpu: cast %s to %s on cuda:%d: %w", from, to, c.s.d.ordinal, c.why)
	}
	if !cast.Supported(from, to) || castCode(from) == 0 || castCode(to) == 0 {
		return fmt.Errorf("gpu: cast %s to %s: %w (the kernel converts F32→BF16, F32→F16, BF16↔F16, BF16→F32, F16→F32 and copies F32, BF16 and F16)",
			from, to, cast.ErrUnsupported)
	}
	if elems < 0 {
		return fmt.Errorf("gpu: cast %s to %s: %d elements", from, to, elems)
	}
	if elems == 0 {
		return nil
	}
	sb, db := uint64(from.Size()), uint64(to.Size())
	if src == 0 || dst == 0 || src%sb != 0 || dst%db != 0 {
		return fmt.Errorf("gpu: cast %s to %s: source %#x and destination %#x must be non-zero device addresses aligned to their %d- and %d-byte elements",
			from, to, src, dst, sb, db)
	}
	n := uint64(elems)
	if n > (1<<62)/4 || src+n*sb < src || dst+n*db < dst {
		return fmt.Errorf("gpu: cast %s to %s: %d elements at %#x or %#x overflow the address space", from, to, elems, src, dst)
	}
	if src < dst+n*db && dst < src+n*sb {
		return fmt.Errorf("gpu: cast %s to %s: source [%#x, %#x) and destination [%#x, %#x) overlap; the GPU cannot convert in place",
			from, to, src, src+n*sb, dst, dst+n*db)
	}
	c.ops = append(c.ops, castOp{dst: dst, src: src, elems: elems, sb: sb, db: db, kind: castCode(from) | castCode(to)<<8})
	return nil
}

// Reset forgets the conversions added since the last Flush.
func (c *Caster) Reset() { c.ops = c.ops[:0] }

// Len returns the number of conversions added and not yet flushed.
func (c *Caster) Len() int { return len(c.ops) }

// Flush queues every conversion added since the last Flush on the stream,
// after everything queued on it before, and forgets them. As with
// CopyBatch, the sources must stay unchanged, and the destinations
// untouched, until an Event recorded after Flush has completed. Flush
// blocks only to rewrite descriptors that a queued launch still reads, at
// most until ctx ends.
func (c *Caster) Flush(ctx context.Context) error {
	if c.k == nil {
		if len(c.ops) == 0 {
			return nil
		}
		return fmt.Errorf("gpu: cast on cuda:%d: %w", c.s.d.ordinal, c.why)
	}
	if err := c.s.check(); err != nil {
		return err
	}
	if len(c.ops) == 0 {
		return nil
	}
	defer func() { c.ops = c.ops[:0] }()
	if err := c.ring.alloc(c.s); err != nil {
		return err
	}
	return c.ring.queue(ctx, c.s, c.k, &castSplitter{ops: c.ops, chunk: c.chunk})
}

// Close forgets conversions not flushed, waits, bounded by ctx, until no
// launch reads the descriptor memory any more, then gives it back to the
// device for later Casters (the device frees it on Close) or frees it. If
// the wait fails the memory stays allocated (rather than be reused under a
// running launch) and Close returns the error. Close is idempotent.
func (c *Caster) Close(ctx context.Context) error {
	c.ops = c.ops[:0]
	return c.ring.close(ctx, c.s)
}

// castSplitter walks the conversions of a Caster as kernel descriptors of
// at most chunk elements each (a multiple of 4, so that every piece keeps
// the alignment of its conversion's groups of four): it stands at element
// off of conversion i.
type castSplitter struct {
	ops   []castOp
	chunk int64
	i     int
	off   int64
}

// done reports whether every element of ops has been handed out.
func (sp *castSplitter) done() bool { return sp.i >= len(sp.ops) }

// fill writes the next descriptors of ops into out, castWords words each
// (source, destination, elements, kind), until out is full or ops is
// done, and returns how many it wrote.
func (sp *castSplitter) fill(out []uint64) int {
	n := 0
	for ; (n+1)*castWords <= len(out) && sp.i < len(sp.ops); n++ {
		op := sp.ops[sp.i]
		m := min(sp.chunk, op.elems-sp.off)
		w := out[n*castWords : (n+1)*castWords]
		w[0], w[1], w[2], w[3] = op.src+uint64(sp.off)*op.sb, op.dst+uint64(sp.off)*op.db, uint64(m), op.kind
		sp.off += m
		if sp.off == op.elems {
			sp.i, sp.off = sp.i+1, 0
		}
	}
	return n
}
