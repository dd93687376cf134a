package gpu

import (
	"fmt"
	"strings"
)

// The generator of the gather kernels (see ptx_gen_test.go): the plain
// copy of Gather.Copy (gather.ptx) and the fused copy and checksum of
// Gather.CopySum (gather_sum.ptx), which copies with the same loops and
// hashes each word it loads into checksum.Sum's word contributions. Both
// run one thread block per range; the fused kernel adds each block's sum
// into the slots once, after a reduction over the block.

// gatherGen describes a generated gather kernel: which one, and the
// choices the benchmarks compare (gatherDefault and gatherSumDefault are
// the ones embedded).
type gatherGen struct {
	sum    bool // the fused copy and checksum, wc_gather_sum; else wc_gather
	unroll int  // the 16-byte vectors each thread loads before it stores them
	// load and store are the cache qualifiers of the 16-byte loads of the
	// copies' sources and of their stores ("": none; see
	// cacheQualifiers in ptx_interp_test.go for the forms).
	load, store string
	minBlocks   int // .minnctapersm, blocks per multiprocessor ptxas must fit; 0: none
	// pipeline: the fused kernel loads the next U vectors before it hashes
	// these (two sets of registers), so that loads are in flight while it
	// hashes; the plain kernel has nothing to overlap.
	pipeline bool
}

var (
	gatherDefault    = gatherGen{unroll: 8}
	gatherSumDefault = gatherGen{sum: true, unroll: 8}
)

// gatherVariants are the choices BenchmarkGatherVariants compares, each as
// the plain and as the fused kernel; TestGatherVariantsPTX runs them all.
// On an H200, copying 1 GiB (one tensor or 64) in pieces of 1 MiB, the
// fused kernel ran at 1584-1639 GB/s with 4 vectors in flight, 1643-1670
// with 8 (the default) and 1596-1638 pipelined (fewer threads fit), over
// two runs; the plain one at 1673-1734 with 4 or 8 alike. Cache
// qualifiers (.nc.L1::no_allocate.L2::256B loads, .L1::no_allocate or
// .cs stores) and .minnctapersm changed no rate by more than the noise.
var gatherVariants = []gatherGen{
	{unroll: 4},
	{unroll: 8},
	{unroll: 8, minBlocks: 3},
	{unroll: 2, pipeline: true},
	{unroll: 4, pipeline: true},
	{unroll: 4, pipeline: true, minBlocks: 3},
	{unroll: 8, pipeline: true},
}

const gatherC = `
gather.ptx: the kernel of Gather.Copy, loaded at run time with
cuModuleLoadDataEx (the driver compiles it for the GPU it runs on). It is
this CUDA C, with U = %[1]d:

  struct wc_range { unsigned long long src, dst, len; };

  // One thread block per range.
  extern "C" __global__ void __launch_bounds__(256%[2]s)
  wc_gather(const wc_range *ranges, unsigned int count) {
    if (blockIdx.x >= count) return;
    const wc_range r = ranges[blockIdx.x];
    const unsigned char *src = (const unsigned char *)r.src;
    unsigned char *dst = (unsigned char *)r.dst;
    unsigned long long t = threadIdx.x, nt = blockDim.x, done = 0;
    if (((r.src | r.dst) & 15) == 0) {
      // 16-byte loads and stores, U in flight per thread.
      const uint4 *s = (const uint4 *)src;
      uint4 *d = (uint4 *)dst;
      unsigned long long nv = r.len / 16, k = t;
      for (; k + (U - 1) * nt < nv; k += U * nt) {
        uint4 v[U];
        for (int j = 0; j < U; j++) v[j] = s[k + j * nt];%[3]s
        for (int j = 0; j < U; j++) d[k + j * nt] = v[j];%[4]s
      }
      for (; k < nv; k += nt) d[k] = s[k];
      done = nv * 16;
    }
    // The tail, or the whole range when it is not 16-byte aligned.
    for (unsigned long long k = done + t; k < r.len; k += nt) dst[k] = src[k];
  }
`

const gatherSumC = `
gather_sum.ptx: the kernel of Gather.CopySum, loaded at run time with
cuModuleLoadDataEx (the driver compiles it for the GPU it runs on). It
copies as the gather kernel does and, in the same pass, sums checksum.Sum's
word contributions of the summed buffer at base, which the host finishes
with checksum.Finish. It is this CUDA C, with U = %[1]d:

  #define PHI 0x9e3779b97f4a7c15ull
  // fmix64 as in checksum.ptx.
  struct wc_sum_range { unsigned long long src, dst, len, sum; };

  // One thread block per range. A range copies len bytes from src to
  // dst, and its sum bytes of the summed buffer start at its side address
  // (dst; src when side is set), a multiple of 8 bytes from base: the
  // first len of them are the bytes copied (read from src), the others
  // (padding that no range copies, or a range that only sums, len == 0)
  // are read at the side address. The block adds its sum into the
  // partial slots[blockIdx.x %% 256]; sum_finish moves the partials into
  // the slot's result, whose 256 words the host adds.
  extern "C" __global__ void __launch_bounds__(256%[2]s)
  wc_gather_sum(const wc_sum_range *ranges, unsigned int count,
      unsigned long long base, unsigned int side, unsigned long long *slots,
      unsigned int first) {
    __shared__ unsigned long long warps[8];
    if (blockIdx.x >= count) goto done;
    const wc_sum_range r = ranges[blockIdx.x];
    const unsigned char *src = (const unsigned char *)r.src;
    unsigned char *dst = (unsigned char *)r.dst;
    const unsigned char *ext = side ? src : dst;
    unsigned long long t = threadIdx.x, nt = blockDim.x, s = 0;
    unsigned long long w0 = ((unsigned long long)ext - base) / 8, done = 0;
    if (((r.src | r.dst) & 15) == 0) {
      // 16-byte loads and stores, U in flight per thread: vector k holds
      // the range's words 2k and 2k+1.
      const ulonglong2 *vs = (const ulonglong2 *)src;
      ulonglong2 *vd = (ulonglong2 *)dst;
      unsigned long long nv = r.len / 16, k = t;
      for (; k + (U - 1) * nt < nv; k += U * nt) {
        ulonglong2 v[U];
        for (int j = 0; j < U; j++) v[j] = vs[k + j * nt];%[3]s
        for (int j = 0; j < U; j++) vd[k + j * nt] = v[j];%[4]s
        for (int j = 0; j < U; j++) {
          unsigned long long i = w0 + 2 * (k + j * nt);
          s += fmix64(v[j].x + (i + 1) * PHI) + fmix64(v[j].y + (i + 2) * PHI);
        }
      }
      for (; k < nv; k += nt) {
        ulonglong2 a = vs[k];
        vd[k] = a;
        s += fmix64(a.x + (w0 + 2 * k + 1) * PHI) + fmix64(a.y + (w0 + 2 * k + 2) * PHI);
      }
      done = nv * 16;
    }
    // The bytes left to copy, or the whole range when it is not aligned.
    for (unsigned long long k = done + t; k < r.len; k += nt) dst[k] = src[k];
    // The words left to sum: byte j is src[j] below len, ext[j] from len.
    for (unsigned long long i = done / 8 + t; i < (r.sum + 7) / 8; i += nt) {
      unsigned long long lo = 8 * i, hi = min(lo + 8, r.sum), w = 0;
      const unsigned char *from = hi <= r.len ? src : ext;
      if ((hi <= r.len || lo >= r.len) && hi - lo == 8 && ((unsigned long long)(from + lo) & 7) == 0) {
        w = *(const unsigned long long *)(from + lo);
      } else {
        for (unsigned long long j = hi; j > lo;) { j--; w = w << 8 | (j < r.len ? src : ext)[j]; }
      }
      s += fmix64(w + (w0 + i + 1) * PHI);
    }
    // The block's sum: each warp's, by butterfly shuffles of its halves,
    // then the warps' through shared memory.
    for (int m = 16; m > 0; m /= 2) s += __shfl_xor_sync(0xffffffff, s, m);
    if (t %% 32 == 0) warps[t / 32] = s;
    __syncthreads();
    if (t == 0) {
      s = 0;
      for (int w = 0; w < (nt + 31) / 32; w++) s += warps[w];
      atomicAdd(&slots[blockIdx.x %% 256], s);  // red.global.add.u64
    }
  done:
    sum_finish(slots, first);
  }
`

// Registers of the gather kernels. The copy loops' addresses and words
// and the hash's constants have fixed numbers, so that the unrolled code
// reads as its loop.
const (
	gsAddr  = 24 // %rd24..: the unroll vectors' addresses
	gsWord  = 32 // %rd32..: their words, two each
	gsWordB = 64 // %rd64..: the second set of words, when pipelined
	gsKey   = 48 // %rd48: the key of the word hashed; %rd49 that plus PHI
	gsTmp   = "%rd50"
	gsPHI   = "%rd51"
	gsMul1  = "%rd52" // fmix64's multipliers
	gsMul2  = "%rd53"
)

// fmix64 writes x = fmix64(x) for each 64-bit register named in xs, the
// steps of all interleaved.
func (p *ptxText) fmix64(xs ...string) {
	xorShift := func() {
		for _, x := range xs {
			p.op("shr.u64", "%s, %s, 33", gsTmp, x)
			p.op("xor.b64", "%s, %s, %s", x, x, gsTmp)
		}
	}
	xorShift()
	for _, mul := range []string{gsMul1, gsMul2} {
		for _, x := range xs {
			p.op("mul.lo.u64", "%s, %s, %s", x, x, mul)
		}
		xorShift()
	}
}

// rd names 64-bit register n.
func rd(n int) string { return fmt.Sprintf("%%rd%d", n) }

// ptx returns the kernel's text.
func (o gatherGen) ptx() string {
	if o.unroll < 1 || o.unroll > 8 {
		panic(fmt.Sprintf("gatherGen: unroll %d, want 1 to 8", o.unroll))
	}
	e, doc := "wc_gather", gatherC
	if o.sum {
		e, doc = "wc_gather_sum", gatherSumC
	}
	bounds, loadNote, storeNote := "", "", ""
	if o.minBlocks > 0 {
		bounds = fmt.Sprintf(", %d", o.minBlocks)
	}
	if o.load != "" {
		loadNote = fmt.Sprintf("  // ld.global%s", o.load)
	}
	if o.store != "" {
		storeNote = fmt.Sprintf("  // st.global%s", o.store)
	}
	var p ptxText
	doc = fmt.Sprintf(doc, o.unroll, bounds, loadNote, storeNote)
	if o.sum {
		doc += sumFinishC
	}
	p.header("gather_ptx_gen_test.go", doc)
	if o.sum {
		p.params(e, "u64 ranges", "u32 count", "u64 base", "u32 side", "u64 slots", "u32 first")
	} else {
		p.params(e, "u64 ranges", "u32 count")
	}
	p.line(".maxntid %d, 1, 1", gatherThreads)
	if o.minBlocks > 0 {
		p.line(".minnctapersm %d", o.minBlocks)
	}
	p.line("{")
	p.line("\t.reg .pred\t%%p<10>;")
	p.line("\t.reg .b16\t%%b;")
	p.line("\t.reg .b32\t%%r<16>;")
	p.line("\t.reg .b64\t%%rd<80>;")
	if o.sum {
		p.line("\t.shared .align 8 .b8\t%s_warps[%d];", e, gatherThreads/32*8)
		p.sumFinishDecls(e)
	}
	p.line("")
	if o.sum {
		p.comment("if (blockIdx.x >= count) goto done;")
	} else {
		p.comment("if (blockIdx.x >= count) return;")
	}
	p.op("ld.param.u32", "%%r1, [%s_count]", e)
	p.op("mov.u32", "%%r2, %%ctaid.x")
	p.op("setp.ge.u32", "%%p1, %%r2, %%r1")
	p.op("@%p1 bra", "DONE")
	words := gatherWords
	if o.sum {
		words = gatherSumWords
	}
	p.comment(fmt.Sprintf("%%rd7 = src, %%rd8 = dst, %%rd9 = len%s: ranges[blockIdx.x]", map[bool]string{true: ", %rd10 = sum"}[o.sum]))
	p.op("ld.param.u64", "%%rd1, [%s_ranges]", e)
	p.op("cvta.to.global.u64", "%%rd1, %%rd1")
	p.op("mul.wide.u32", "%%rd6, %%r2, %d", 8*words)
	p.op("add.s64", "%%rd6, %%rd1, %%rd6")
	if o.sum {
		p.op("ld.global.v2.u64", "{%%rd7, %%rd8}, [%%rd6]")
		p.op("ld.global.v2.u64", "{%%rd9, %%rd10}, [%%rd6+16]")
	} else {
		p.op("ld.global.u64", "%%rd7, [%%rd6]")
		p.op("ld.global.u64", "%%rd8, [%%rd6+8]")
		p.op("ld.global.u64", "%%rd9, [%%rd6+16]")
	}
	p.comment("%r5 = t, %r6 = nt, as 64 bits %rd3 and %rd4")
	p.op("mov.u32", "%%r5, %%tid.x")
	p.op("cvt.u64.u32", "%%rd3, %%r5")
	p.op("mov.u32", "%%r6, %%ntid.x")
	p.op("cvt.u64.u32", "%%rd4, %%r6")
	if o.sum {
		p.comment("%rd5 = s; %rd11 = ext, %rd12 = w0 = (ext - base) / 8; PHI and fmix64's multipliers")
		p.op("ld.param.u32", "%%r4, [%s_side]", e)
		p.op("setp.ne.u32", "%%p2, %%r4, 0")
		p.op("ld.param.u64", "%%rd2, [%s_base]", e)
		p.op("mov.u64", "%%rd5, 0")
		p.op("mov.u64", "%s, -7046029254386353131", gsPHI)
		p.op("mov.u64", "%s, -49064778989728563", gsMul1)
		p.op("mov.u64", "%s, -4265267296055464877", gsMul2)
		p.op("selp.b64", "%%rd11, %%rd7, %%rd8, %%p2")
		p.op("sub.u64", "%%rd12, %%rd11, %%rd2")
		p.op("shr.u64", "%%rd12, %%rd12, 3")
		p.op("cvta.to.global.u64", "%%rd11, %%rd11")
	}
	p.op("cvta.to.global.u64", "%%rd7, %%rd7")
	p.op("cvta.to.global.u64", "%%rd8, %%rd8")
	p.comment("%rd13 = done")
	p.op("mov.u64", "%%rd13, 0")
	p.comment("if (((src | dst) & 15) == 0) {")
	p.op("or.b64", "%%rd14, %%rd7, %%rd8")
	p.op("and.b64", "%%rd14, %%rd14, 15")
	p.op("setp.ne.u64", "%%p3, %%rd14, 0")
	p.op("@%p3 bra", "BYTES")
	o.vectors(&p)
	o.bytes(&p)
	if o.sum {
		o.sumWords(&p)
		o.reduce(&p, e)
	}
	p.label("DONE", "")
	if o.sum {
		p.sumFinish(e)
	} else {
		p.line("\tret;")
	}
	p.line("}")
	return p.b.String()
}

// vectors writes the loops of 16-byte loads and stores (and hashes).
func (o gatherGen) vectors(p *ptxText) {
	u := o.unroll
	p.comment("%rd15 = nv, %rd16 = k, %rd19 = (U-1) nt, %rd20 = 16 nt (bytes per step of nt), %rd21 = U nt")
	p.op("shr.u64", "%%rd15, %%rd9, 4")
	p.op("mov.u64", "%%rd16, %%rd3")
	p.op("mul.lo.u64", "%%rd19, %%rd4, %d", u-1)
	p.op("shl.b64", "%%rd20, %%rd4, 4")
	p.op("mul.lo.u64", "%%rd21, %%rd4, %d", u)
	if o.sum {
		p.comment("%rd17 = key = (w0 + 2k + 1) PHI, the key of vector k's first word; %rd18 = step = 2 nt PHI")
		p.op("shl.b64", "%%rd17, %%rd3, 1")
		p.op("add.u64", "%%rd17, %%rd17, %%rd12")
		p.op("add.u64", "%%rd17, %%rd17, 1")
		p.op("mul.lo.u64", "%%rd17, %%rd17, %s", gsPHI)
		p.op("shl.b64", "%%rd18, %%rd4, 1")
		p.op("mul.lo.u64", "%%rd18, %%rd18, %s", gsPHI)
	}
	// more branches to skip when the vectors k + j nt, j < U, are not
	// all there.
	more := func(skip string) {
		p.op("add.u64", "%%rd23, %%rd16, %%rd19")
		p.op("setp.ge.u64", "%%p4, %%rd23, %%rd15")
		p.op("@%p4 bra", "%s", skip)
	}
	if !o.pipeline || !o.sum {
		p.label("VEC", fmt.Sprintf("for (; k + (U-1) nt < nv; k += U nt): %s..%s the addresses, %s..%s the words", rd(gsAddr), rd(gsAddr+u-1), rd(gsWord), rd(gsWord+2*u-1)))
		more("VEC1")
		o.loadSet(p, gsWord)
		o.storeSet(p, gsWord)
		o.hashSet(p, gsWord)
		p.op("add.u64", "%%rd16, %%rd16, %%rd21")
		p.op("bra.uni", "VEC")
	} else {
		// Two sets of registers take turns: a set's vectors are loaded
		// before the other set's are hashed.
		p.comment(fmt.Sprintf("for (; k + (U-1) nt < nv; k += U nt), the loads of the next U vectors before the hashes of these: sets %s.. and %s..", rd(gsWord), rd(gsWordB)))
		more("VEC1")
		o.loadSet(p, gsWord)
		for i, set := range []int{gsWord, gsWordB} {
			other := gsWord + gsWordB - set
			p.label(fmt.Sprintf("PIPE%d", i), "")
			o.storeSet(p, set)
			p.op("add.u64", "%%rd16, %%rd16, %%rd21")
			more(fmt.Sprintf("LAST%d", i))
			o.loadSet(p, other)
			o.hashSet(p, set)
		}
		p.op("bra.uni", "PIPE0")
		for i, set := range []int{gsWord, gsWordB} {
			p.label(fmt.Sprintf("LAST%d", i), "")
			o.hashSet(p, set)
			p.op("bra.uni", "VEC1")
		}
	}

	p.label("VEC1", "for (; k < nv; k += nt)")
	p.op("setp.ge.u64", "%%p4, %%rd16, %%rd15")
	p.op("@%p4 bra", "VECEND")
	p.op("shl.b64", "%%rd23, %%rd16, 4")
	p.op("add.s64", "%s, %%rd7, %%rd23", rd(gsAddr))
	p.op("ld.global"+o.load+".v2.u64", "{%s, %s}, [%s]", rd(gsWord), rd(gsWord+1), rd(gsAddr))
	p.op("add.s64", "%s, %%rd8, %%rd23", rd(gsAddr))
	p.op("st.global"+o.store+".v2.u64", "[%s], {%s, %s}", rd(gsAddr), rd(gsWord), rd(gsWord+1))
	if o.sum {
		p.op("add.u64", "%s, %s, %%rd17", rd(gsWord), rd(gsWord))
		p.op("add.u64", "%s, %%rd17, %s", rd(gsKey+1), gsPHI)
		p.op("add.u64", "%s, %s, %s", rd(gsWord+1), rd(gsWord+1), rd(gsKey+1))
		p.fmix64(rd(gsWord), rd(gsWord+1))
		p.op("add.u64", "%%rd5, %%rd5, %s", rd(gsWord))
		p.op("add.u64", "%%rd5, %%rd5, %s", rd(gsWord+1))
		p.op("add.u64", "%%rd17, %%rd17, %%rd18")
	}
	p.op("add.u64", "%%rd16, %%rd16, %%rd4")
	p.op("bra.uni", "VEC1")
	p.label("VECEND", "done = nv * 16")
	p.op("shl.b64", "%%rd13, %%rd15, 4")
}

// vectorAddrs writes the addresses of the vectors k + j nt, j < U, of the
// range from base (%rd7, the source, or %rd8, the destination) into
// gsAddr.., with %rd23 = 16 k.
func (o gatherGen) vectorAddrs(p *ptxText, base string) {
	p.op("shl.b64", "%%rd23, %%rd16, 4")
	p.op("add.s64", "%s, %s, %%rd23", rd(gsAddr), base)
	for j := 1; j < o.unroll; j++ {
		p.op("add.s64", "%s, %s, %%rd20", rd(gsAddr+j), rd(gsAddr+j-1))
	}
}

// loadSet loads the vectors k + j nt, j < U, into the set of registers
// from set.
func (o gatherGen) loadSet(p *ptxText, set int) {
	o.vectorAddrs(p, "%rd7")
	for j := range o.unroll {
		p.op("ld.global"+o.load+".v2.u64", "{%s, %s}, [%s]", rd(set+2*j), rd(set+2*j+1), rd(gsAddr+j))
	}
}

// storeSet stores the set of registers from set at the vectors k + j nt
// of the destination.
func (o gatherGen) storeSet(p *ptxText, set int) {
	o.vectorAddrs(p, "%rd8")
	for j := range o.unroll {
		p.op("st.global"+o.store+".v2.u64", "[%s], {%s, %s}", rd(gsAddr+j), rd(set+2*j), rd(set+2*j+1))
	}
}

// hashSet adds the word contributions of the set of registers from set,
// vectors of keys %rd17 + j step, into s, and moves the key U vectors on.
// The plain kernel hashes nothing.
func (o gatherGen) hashSet(p *ptxText, set int) {
	if !o.sum {
		return
	}
	p.comment(fmt.Sprintf("word 2k + 2j nt (+1) adds key + j step (+ PHI); %s = the key of each", rd(gsKey)))
	p.op("mov.u64", "%s, %%rd17", rd(gsKey))
	var ws []string
	for j := range o.unroll {
		if j > 0 {
			p.op("add.u64", "%s, %s, %%rd18", rd(gsKey), rd(gsKey))
		}
		p.op("add.u64", "%s, %s, %s", rd(set+2*j), rd(set+2*j), rd(gsKey))
		p.op("add.u64", "%s, %s, %s", rd(gsKey+1), rd(gsKey), gsPHI)
		p.op("add.u64", "%s, %s, %s", rd(set+2*j+1), rd(set+2*j+1), rd(gsKey+1))
		ws = append(ws, rd(set+2*j), rd(set+2*j+1))
	}
	p.fmix64(ws...)
	for _, w := range ws {
		p.op("add.u64", "%%rd5, %%rd5, %s", w)
	}
	p.op("add.u64", "%%rd17, %s, %%rd18", rd(gsKey))
}

// bytes writes the loop that copies the bytes left.
func (o gatherGen) bytes(p *ptxText) {
	next := "DONE"
	if o.sum {
		next = "WORDS"
	}
	p.label("BYTES", "for (k = done + t; k < len; k += nt) dst[k] = src[k]")
	p.op("add.u64", "%%rd23, %%rd13, %%rd3")
	p.label("BYTE", "")
	p.op("setp.ge.u64", "%%p4, %%rd23, %%rd9")
	p.op("@%p4 bra", "%s", next)
	p.op("add.s64", "%%rd24, %%rd7, %%rd23")
	p.op("ld.global.u8", "%%b, [%%rd24]")
	p.op("add.s64", "%%rd24, %%rd8, %%rd23")
	p.op("st.global.u8", "[%%rd24], %%b")
	p.op("add.u64", "%%rd23, %%rd23, %%rd4")
	p.op("bra.uni", "BYTE")
}

// sumWords writes the fused kernel's loop over the words left to sum.
func (o gatherGen) sumWords(p *ptxText) {
	p.label("WORDS", "for (i = done / 8 + t; i < (sum + 7) / 8; i += nt): %rd24 = i, %rd25 = (sum + 7) / 8")
	p.op("shr.u64", "%%rd24, %%rd13, 3")
	p.op("add.u64", "%%rd24, %%rd24, %%rd3")
	p.op("add.u64", "%%rd25, %%rd10, 7")
	p.op("shr.u64", "%%rd25, %%rd25, 3")
	p.label("WORD", "%rd26 = lo, %rd27 = hi, %rd28 = w, %rd29 = from")
	p.op("setp.ge.u64", "%%p4, %%rd24, %%rd25")
	p.op("@%p4 bra", "REDUCE")
	p.op("shl.b64", "%%rd26, %%rd24, 3")
	p.op("add.u64", "%%rd27, %%rd26, 8")
	p.op("min.u64", "%%rd27, %%rd27, %%rd10")
	p.op("mov.u64", "%%rd28, 0")
	p.comment("one 8-byte load when the word is whole, from one side, and aligned")
	p.op("setp.le.u64", "%%p5, %%rd27, %%rd9")
	p.op("selp.b64", "%%rd29, %%rd7, %%rd11, %%p5")
	p.op("@%p5 bra", "ONESIDE")
	p.op("setp.lt.u64", "%%p6, %%rd26, %%rd9")
	p.op("@%p6 bra", "WBYTES")
	p.label("ONESIDE", "")
	p.op("sub.u64", "%%rd30, %%rd27, %%rd26")
	p.op("setp.ne.u64", "%%p6, %%rd30, 8")
	p.op("@%p6 bra", "WBYTES")
	p.op("add.s64", "%%rd31, %%rd29, %%rd26")
	p.op("and.b64", "%%rd30, %%rd31, 7")
	p.op("setp.ne.u64", "%%p6, %%rd30, 0")
	p.op("@%p6 bra", "WBYTES")
	p.op("ld.global.u64", "%%rd28, [%%rd31]")
	p.op("bra.uni", "WSUM")
	p.label("WBYTES", "for (j = hi; j > lo;) { j--; w = w << 8 | (j < len ? src : ext)[j]; }")
	p.op("mov.u64", "%%rd30, %%rd27")
	p.label("WBYTE", "")
	p.op("setp.le.u64", "%%p6, %%rd30, %%rd26")
	p.op("@%p6 bra", "WSUM")
	p.op("sub.u64", "%%rd30, %%rd30, 1")
	p.op("setp.lt.u64", "%%p7, %%rd30, %%rd9")
	p.op("selp.b64", "%%rd31, %%rd7, %%rd11, %%p7")
	p.op("add.s64", "%%rd31, %%rd31, %%rd30")
	p.op("ld.global.u8", "%%b, [%%rd31]")
	p.op("cvt.u64.u16", "%%rd32, %%b")
	p.op("shl.b64", "%%rd28, %%rd28, 8")
	p.op("or.b64", "%%rd28, %%rd28, %%rd32")
	p.op("bra.uni", "WBYTE")
	p.label("WSUM", "s += fmix64(w + (w0 + i + 1) * PHI)")
	p.op("add.u64", "%%rd30, %%rd12, %%rd24")
	p.op("add.u64", "%%rd30, %%rd30, 1")
	p.op("mul.lo.u64", "%%rd30, %%rd30, %s", gsPHI)
	p.op("add.u64", "%%rd28, %%rd28, %%rd30")
	p.fmix64("%rd28")
	p.op("add.u64", "%%rd5, %%rd5, %%rd28")
	p.op("add.u64", "%%rd24, %%rd24, %%rd4")
	p.op("bra.uni", "WORD")
}

// reduce writes the fused kernel's sum over the block and its one add
// into the slots.
func (o gatherGen) reduce(p *ptxText, e string) {
	p.label("REDUCE", "the warp's sum: s += s of lane ^ m, m = 16, 8, 4, 2, 1, by halves")
	for m := 16; m > 0; m /= 2 {
		p.op("mov.b64", "{%%r7, %%r8}, %%rd5")
		p.op("shfl.sync.bfly.b32", "%%r9, %%r7, %d, 31, 0xffffffff", m)
		p.op("shfl.sync.bfly.b32", "%%r10, %%r8, %d, 31, 0xffffffff", m)
		p.op("mov.b64", "%%rd54, {%%r9, %%r10}")
		p.op("add.u64", "%%rd5, %%rd5, %%rd54")
	}
	p.comment("if (t % 32 == 0) warps[t / 32] = s;")
	p.op("and.b32", "%%r11, %%r5, 31")
	p.op("setp.ne.u32", "%%p8, %%r11, 0")
	p.op("@%p8 bra", "WAIT")
	p.op("shr.u32", "%%r12, %%r5, 5")
	p.op("shl.b32", "%%r12, %%r12, 3")
	p.op("mov.u32", "%%r13, %s_warps", e)
	p.op("add.u32", "%%r12, %%r13, %%r12")
	p.op("st.shared.u64", "[%%r12], %%rd5")
	p.label("WAIT", "__syncthreads()")
	p.op("bar.sync", "0")
	p.comment("thread 0: s = the warps' sums, %r13 walking warps up to %r12")
	p.op("setp.ne.u32", "%%p8, %%r5, 0")
	p.op("@%p8 bra", "DONE")
	p.op("mov.u32", "%%r13, %s_warps", e)
	p.op("add.u32", "%%r12, %%r6, 31")
	p.op("shr.u32", "%%r12, %%r12, 5")
	p.op("shl.b32", "%%r12, %%r12, 3")
	p.op("add.u32", "%%r12, %%r13, %%r12")
	p.op("mov.u64", "%%rd5, 0")
	p.label("WARP", "")
	p.op("ld.shared.u64", "%%rd54, [%%r13]")
	p.op("add.u64", "%%rd5, %%rd5, %%rd54")
	p.op("add.u32", "%%r13, %%r13, 8")
	p.op("setp.lt.u32", "%%p8, %%r13, %%r12")
	p.op("@%p8 bra", "WARP")
	p.comment("red.global.add.u64 slots[blockIdx.x % 256], s")
	p.op("ld.param.u64", "%%rd55, [%s_slots]", e)
	p.op("cvta.to.global.u64", "%%rd55, %%rd55")
	p.op("and.b32", "%%r14, %%r2, 255")
	p.op("mul.wide.u32", "%%rd56, %%r14, 8")
	p.op("add.s64", "%%rd56, %%rd55, %%rd56")
	p.op("red.global.add.u64", "[%%rd56], %%rd5")
}

// String names the variant in benchmarks and tests.
func (o gatherGen) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "unroll=%d", o.unroll)
	if o.load != "" {
		fmt.Fprintf(&b, ",ld%s", o.load)
	}
	if o.store != "" {
		fmt.Fprintf(&b, ",st%s", o.store)
	}
	if o.minBlocks > 0 {
		fmt.Fprintf(&b, ",minBlocks=%d", o.minBlocks)
	}
	if o.pipeline {
		b.WriteString(",pipelined")
	}
	return b.String()
}
