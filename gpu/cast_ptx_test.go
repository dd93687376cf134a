package gpu

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
)

// The tests below run the embedded cast.ptx on the host, through the PTX
// interpreter of ptx_interp_test.go, on conversions described exactly as
// Caster describes them to the GPU (castSplitter, in small pieces and
// descriptor slots), and compare every output byte with cast.Convert. The
// source is mapped read-only and the destination is a region of exactly
// the output's size, filled with 0xA5 beforehand: a load outside the
// source, a store outside the destination or a missed element fails.

const (
	ptxCastSrc  = 0x7f0000000000
	ptxCastDst  = 0x7f1000000000
	ptxCastDesc = 0x7f2000000000
)

func castPTXKernel(t *testing.T) *ptxKernel {
	k := parsePTX(t, "cast.ptx", castPTX)
	if k.name != "wc_cast" || len(k.params) != 2 || k.paramSize[0] != 8 || k.paramSize[1] != 4 {
		t.Fatalf("kernel %s(%v): want wc_cast(u64 descs, u32 count)", k.name, k.params)
	}
	return k
}

// castCase converts src from one dtype to another, from srcOff bytes
// past an aligned address (ptxCastSrc in the interpreter) into a
// destination dstOff bytes past one.
type castCase struct {
	from, to       dtype.DType
	src            []byte
	srcOff, dstOff uint64
}

// castCasesAligned returns the conversions at aligned addresses that the
// interpreter and the GPU tests both run: every 16-bit input (every) of
// BF16→F16, F16→BF16, BF16→F32 and F16→F32, and the float32 inputs random
// to BF16 and to F16.
func castCasesAligned(every, random []byte) []castCase {
	return []castCase{
		{dtype.BF16, dtype.F16, every, 0, 0},
		{dtype.F16, dtype.BF16, every, 0, 0},
		{dtype.BF16, dtype.F32, every, 0, 0},
		{dtype.F16, dtype.F32, every, 0, 0},
		{dtype.F32, dtype.BF16, random, 0, 0},
		{dtype.F32, dtype.F16, random, 0, 0},
	}
}

// runCastPTX runs one conversion through the kernel in pieces of chunk
// elements, slots of slotDescs descriptors, threads threads per block, and
// compares the output with cast.Convert. It returns the number of groups
// of four and of single elements the pieces hold.
func runCastPTX(t *testing.T, k *ptxKernel, c castCase, chunk int64, slotDescs, threads int) (groups, singles int) {
	t.Helper()
	n := len(c.src) / c.from.Size()
	want := make([]byte, n*c.to.Size())
	if err := cast.Convert(want, c.to, c.src, c.from); err != nil {
		t.Fatal(err)
	}
	dst := bytes.Repeat([]byte{0xA5}, len(want))
	ca := &Caster{k: &loadedKernel{}, chunk: chunk}
	if err := ca.Add(ptxCastDst+c.dstOff, ptxCastSrc+c.srcOff, int64(n), c.from, c.to); err != nil {
		t.Fatal(err)
	}
	words := make([]uint64, slotDescs*castWords)
	desc := make([]byte, len(words)*8)
	sp := castSplitter{ops: ca.ops, chunk: chunk}
	for launch := 0; !sp.done(); launch++ {
		m := sp.fill(words)
		for i, w := range words[:m*castWords] {
			binary.LittleEndian.PutUint64(desc[8*i:], w)
		}
		for i := range m {
			e := int(words[i*castWords+2])
			src, dst := words[i*castWords], words[i*castWords+1]
			if (src%(4*uint64(c.from.Size())) == 0) && (dst%(4*uint64(c.to.Size())) == 0) {
				groups, singles = groups+e/4, singles+e%4
			} else {
				singles += e
			}
		}
		mem := &ptxMemory{}
		mem.addRegion(ptxCastSrc+c.srcOff, c.src, true, "source")
		mem.add(ptxCastDst+c.dstOff, dst)
		mem.addRegion(ptxCastDesc, desc[:m*castWords*8], true, "descriptors")
		// A grid larger than the descriptors leaves the extra blocks idle.
		if err := k.run(mem, m+1, threads, ptxCastDesc, uint64(m)); err != nil {
			t.Fatalf("%s to %s, launch %d: %v", c.from, c.to, launch, err)
		}
	}
	if i := diffAt(dst, want); i >= 0 {
		sz := c.to.Size()
		e := i / sz
		in := c.src[e*c.from.Size() : (e+1)*c.from.Size()]
		t.Fatalf("%s to %s (source at +%d, destination at +%d): element %d (input % x) is % x, want % x",
			c.from, c.to, c.srcOff, c.dstOff, e, in, dst[e*sz:(e+1)*sz], want[e*sz:(e+1)*sz])
	}
	return groups, singles
}

// all16 returns every 16-bit value in order, little-endian.
func all16() []byte {
	b := make([]byte, 2<<16)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(i))
	}
	return b
}

// f32Inputs returns castEdgeF32 followed by random bit patterns, n in all.
func f32Inputs(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 3))
	b := make([]byte, 4*n)
	for i := range n {
		v := rng.Uint32()
		if i < len(castEdgeF32) {
			v = castEdgeF32[i]
		}
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return b
}

// TestCastPTX converts every 16-bit input of BF16→F16, F16→BF16,
// BF16→F32 and F16→F32, and the float32 edge cases plus 200,000 random
// bit patterns to BF16 and to F16, with the kernel's groups of four; then
// smaller conversions at misaligned addresses (one element at a time) and
// the identities (NaN payloads kept).
func TestCastPTX(t *testing.T) {
	skipUnderRace(t)
	k := castPTXKernel(t)
	every := all16()
	random := f32Inputs(200_002, 21)
	cases := append(castCasesAligned(every, random), []castCase{
		{dtype.F32, dtype.F16, random[:4*3001], 0, 2},
		{dtype.F32, dtype.BF16, random[4*100 : 4*3101], 4, 0},
		{dtype.F16, dtype.F32, every[2 : 2+2*3001], 2, 4},
		{dtype.BF16, dtype.F16, every[2 : 2+2*3001], 2, 0},
		{dtype.F16, dtype.BF16, every[:2*3001], 0, 6},
		{dtype.BF16, dtype.F32, every[0xFF80*2 : 0xFFFF*2], 8, 0},
		{dtype.F32, dtype.F32, random[:4*999], 0, 0},
		{dtype.F32, dtype.F32, random[:4*999], 4, 8},
		{dtype.BF16, dtype.BF16, every[0x7F00*2 : 0x8100*2], 0, 0},
		{dtype.F16, dtype.F16, every[0xFC00*2:], 0, 2},
	}...)
	for i, c := range cases {
		threads := []int{32, 64, 7}[i%3]
		groups, singles := runCastPTX(t, k, c, 4096, 8, threads)
		t.Logf("%s to %s: %d elements, %d groups of four and %d single elements, %d threads a block",
			c.from, c.to, len(c.src)/c.from.Size(), groups, singles, threads)
	}
}

// TestCastPTXPaths checks that the kernel loads and stores groups of four
// elements with one 8- or 16-byte access each where the addresses allow,
// and one element at a time only for the rest.
func TestCastPTXPaths(t *testing.T) {
	k := castPTXKernel(t)
	src := f32Inputs(1003, 5)
	for _, c := range []struct {
		from, to       dtype.DType
		srcOff, dstOff uint64
		loads          map[string]int
		stores         map[string]int
	}{
		{dtype.F32, dtype.BF16, 0, 0,
			map[string]int{"ld.global.v4.u32": 250, "ld.global.u32": 3},
			map[string]int{"st.global.v2.u32": 250, "st.global.u16": 3}},
		{dtype.BF16, dtype.F32, 0, 0,
			map[string]int{"ld.global.v2.u32": 501, "ld.global.u16": 2},
			map[string]int{"st.global.v4.u32": 501, "st.global.u32": 2}},
		{dtype.F32, dtype.F16, 0, 2,
			map[string]int{"ld.global.v4.u32": 0, "ld.global.u32": 1003},
			map[string]int{"st.global.v2.u32": 0, "st.global.u16": 1003}},
	} {
		in := src
		if c.from != dtype.F32 {
			in = src[:2*2006]
		}
		k.resetCounts()
		runCastPTX(t, k, castCase{c.from, c.to, in, c.srcOff, c.dstOff}, 1<<16, 4, 32)
		for op, want := range c.loads {
			if got := k.executed(op); got != want {
				t.Errorf("%s to %s at +%d/+%d: %d %s, want %d", c.from, c.to, c.srcOff, c.dstOff, got, op, want)
			}
		}
		for op, want := range c.stores {
			if got := k.executed(op); got != want {
				t.Errorf("%s to %s at +%d/+%d: %d %s, want %d", c.from, c.to, c.srcOff, c.dstOff, got, op, want)
			}
		}
	}
}

// TestCastSplitter checks the descriptors Caster builds: every
// conversion is covered exactly once, in pieces of at most the chunk size
// that start at multiples of it, with the right addresses and kind,
// resumable across slots of any size.
func TestCastSplitter(t *testing.T) {
	c := &Caster{k: &loadedKernel{}, chunk: 4}
	sizes := []int64{1, 3, 4, 5, 8, 9, CastChunk - 1, CastChunk, CastChunk + 1, 3*CastChunk + 5}
	pairs := [][2]dtype.DType{{dtype.F32, dtype.BF16}, {dtype.BF16, dtype.F32}, {dtype.F16, dtype.F16}}
	for i, n := range sizes {
		p := pairs[i%len(pairs)]
		if err := c.Add(uint64(1+i)<<40, uint64(1+i)<<32, n, p[0], p[1]); err != nil {
			t.Fatal(err)
		}
	}
	var want [][]uint64
	for i, n := range sizes {
		p := pairs[i%len(pairs)]
		dst, src := uint64(1+i)<<40, uint64(1+i)<<32
		sb, db := uint64(p[0].Size()), uint64(p[1].Size())
		for off := int64(0); off < n; off += CastChunk {
			want = append(want, []uint64{src + uint64(off)*sb, dst + uint64(off)*db, uint64(min(CastChunk, n-off)), castCode(p[0]) | castCode(p[1])<<8})
		}
	}
	checkSplitter(t, castWords, want, func() descSource { return &castSplitter{ops: c.ops, chunk: CastChunk} })
	if CastChunk%4 != 0 || castCheckChunk%4 != 0 {
		t.Fatal("cast pieces must be whole groups of four elements")
	}
}

// TestCasterAddRefuses checks Add's errors: unsupported pairs, misaligned
// or zero addresses, negative counts, overlapping ranges, a Caster
// without its kernel.
func TestCasterAddRefuses(t *testing.T) {
	c := &Caster{s: &Stream{d: &CUDADevice{}}, k: &loadedKernel{}, chunk: CastChunk}
	for name, err := range map[string]error{
		"F32 to F64":        c.Add(1<<20, 2<<20, 10, dtype.F32, dtype.F64),
		"I32 to F32":        c.Add(1<<20, 2<<20, 10, dtype.I32, dtype.F32),
		"F8 to BF16":        c.Add(1<<20, 2<<20, 10, dtype.F8E4M3, dtype.BF16),
		"negative":          c.Add(1<<20, 2<<20, -1, dtype.F32, dtype.BF16),
		"source misaligned": c.Add(1<<20, 2<<20+2, 10, dtype.F32, dtype.BF16),
		"dest misaligned":   c.Add(1<<20+1, 2<<20, 10, dtype.F32, dtype.BF16),
		"zero address":      c.Add(0, 2<<20, 10, dtype.F32, dtype.BF16),
		"in place":          c.Add(1<<20, 1<<20, 10, dtype.F32, dtype.BF16),
		"overlap":           c.Add(1<<20+16, 1<<20, 10, dtype.BF16, dtype.F32),
		"overflow":          c.Add(1<<20, 1<<63, 1<<61, dtype.F32, dtype.F32),
	} {
		if err == nil {
			t.Errorf("%s: Add succeeded", name)
		}
	}
	if c.Len() != 0 {
		t.Fatalf("%d conversions kept after refusals", c.Len())
	}
	if err := c.Add(1<<20, 2<<20, 0, dtype.F32, dtype.BF16); err != nil || c.Len() != 0 {
		t.Fatalf("an empty conversion: %v, %d kept", err, c.Len())
	}
	if err := c.Add(1<<20, 1<<20+40, 10, dtype.F32, dtype.BF16); err != nil || c.Len() != 1 {
		t.Fatalf("adjacent ranges: %v, %d kept", err, c.Len())
	}
	off := &Caster{s: c.s, why: fmt.Errorf("%w: test", ErrNoCastKernel)}
	if err := off.Add(1<<20, 2<<20, 10, dtype.F32, dtype.BF16); err == nil || !errors.Is(err, ErrNoCastKernel) {
		t.Fatalf("Add without a kernel: %v", err)
	}
}

// TestCastCheckCases keeps the device self-test's conversions inside its
// buffers, apart from each other, and covering every 16-bit input.
func TestCastCheckCases(t *testing.T) {
	src, cases := castCheckSource()
	offs, size := castCheckLayout(cases)
	used := make([]bool, size)
	for i, c := range cases {
		if c.srcOff+c.n*c.from.Size() > len(src) {
			t.Fatalf("%+v reads past the %d-byte source", c, len(src))
		}
		if c.srcOff%c.from.Size() != 0 || offs[i]%c.to.Size() != 0 {
			t.Fatalf("%+v is misaligned for its elements", c)
		}
		for j := offs[i]; j < offs[i]+c.n*c.to.Size(); j++ {
			if j >= size || used[j] {
				t.Fatalf("%+v overlaps an earlier output or the end", c)
			}
			used[j] = true
		}
	}
}
