package gpu

import "fmt"

// The generator of the fused gather and checksum kernel, gather_sum.ptx
// (see ptx_gen_test.go): the gather kernel's copy loops, each loaded word
// also hashed into the thread's checksum sum (checksum.ptx's fmix64), eight
// words per step of the unrolled loop.

const gatherSumC = `
gather_sum.ptx: the kernel of Gather.CopySum, loaded at run time with
cuModuleLoadDataEx (the driver compiles it for the GPU it runs on). It
copies as the gather kernel does and, in the same pass, sums checksum.Sum's
word contributions of the summed buffer at base, which the host finishes
with checksum.Finish. It is this CUDA C:

  #define PHI 0x9e3779b97f4a7c15ull
  // fmix64 as in checksum.ptx.
  struct wc_sum_range { unsigned long long src, dst, len, sum; };

  // Each block takes ranges blockIdx.x, blockIdx.x + gridDim.x, ... of
  // count. A range copies len bytes from src to dst, and its sum bytes of
  // the summed buffer start at its side address (dst; src when side is
  // set), a multiple of 8 bytes from base: the first len of them are the
  // bytes copied (read from src), the others (padding that no range
  // copies, or a range that only sums, len == 0) are read at the side
  // address. Every thread adds its sum into slots[g % 256] once, at the
  // end (the host adds the 256 slots, zeroed before the launch).
  extern "C" __global__ void wc_gather_sum(const wc_sum_range *ranges, unsigned int count,
      unsigned long long base, unsigned int side, unsigned long long *slots) {
    unsigned long long t = threadIdx.x, nt = blockDim.x, s = 0;
    for (unsigned int d = blockIdx.x; d < count; d += gridDim.x) {
      const wc_sum_range r = ranges[d];
      const unsigned char *src = (const unsigned char *)r.src;
      unsigned char *dst = (unsigned char *)r.dst;
      const unsigned char *ext = side ? src : dst;
      unsigned long long w0 = ((unsigned long long)ext - base) / 8, done = 0;
      if (((r.src | r.dst) & 15) == 0) {
        // 16-byte loads and stores, four in flight per thread: vector k
        // holds the range's words 2k and 2k+1.
        const ulonglong2 *vs = (const ulonglong2 *)src;
        ulonglong2 *vd = (ulonglong2 *)dst;
        unsigned long long nv = r.len / 16, k = t;
        for (; k + 3 * nt < nv; k += 4 * nt) {
          ulonglong2 a = vs[k], b = vs[k + nt], c = vs[k + 2 * nt], e = vs[k + 3 * nt];
          vd[k] = a; vd[k + nt] = b; vd[k + 2 * nt] = c; vd[k + 3 * nt] = e;
          s += fmix64(a.x + (w0 + 2 * k + 1) * PHI) + fmix64(a.y + (w0 + 2 * k + 2) * PHI);
          ... and b, c, e, at k + nt, k + 2 * nt, k + 3 * nt;
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
    }
    atomicAdd(&slots[((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) % 256], s);  // red.global.add.u64
  }
`

// fmix64 writes x = fmix64(x) for each 64-bit register named in xs, the
// steps of all interleaved; %rd41 and %rd42 hold its multipliers, and
// %rd37 is a scratch register.
func (p *ptxText) fmix64(xs ...string) {
	xorShift := func() {
		for _, x := range xs {
			p.op("shr.u64", "%%rd37, %s, 33", x)
			p.op("xor.b64", "%s, %s, %%rd37", x, x)
		}
	}
	xorShift()
	for _, mul := range []string{"%rd41", "%rd42"} {
		for _, x := range xs {
			p.op("mul.lo.u64", "%s, %s, %s", x, x, mul)
		}
		xorShift()
	}
}

func genGatherSum() string {
	const e = "wc_gather_sum"
	var p ptxText
	p.header("gather_sum_ptx_gen_test.go", gatherSumC)
	p.params(e, "u64 ranges", "u32 count", "u64 base", "u32 side", "u64 slots")
	p.line("{")
	p.line("\t.reg .pred\t%%p<10>;")
	p.line("\t.reg .b16\t%%b;")
	p.line("\t.reg .b32\t%%r<8>;")
	p.line("\t.reg .b64\t%%rd<48>;")
	p.line("")
	p.comment("%r1 = count, %r2 = d, %r3 = gridDim.x, %p1 = side; %rd1 = ranges, %rd2 = base")
	p.op("ld.param.u32", "%%r1, [%s_count]", e)
	p.op("mov.u32", "%%r2, %%ctaid.x")
	p.op("mov.u32", "%%r3, %%nctaid.x")
	p.op("ld.param.u32", "%%r4, [%s_side]", e)
	p.op("setp.ne.u32", "%%p1, %%r4, 0")
	p.op("ld.param.u64", "%%rd1, [%s_ranges]", e)
	p.op("cvta.to.global.u64", "%%rd1, %%rd1")
	p.op("ld.param.u64", "%%rd2, [%s_base]", e)
	p.comment("%rd3 = t, %rd4 = nt, %rd5 = s; %rd40 = PHI, %rd41 and %rd42 fmix64's multipliers")
	p.op("mov.u32", "%%r5, %%tid.x")
	p.op("cvt.u64.u32", "%%rd3, %%r5")
	p.op("mov.u32", "%%r5, %%ntid.x")
	p.op("cvt.u64.u32", "%%rd4, %%r5")
	p.op("mov.u64", "%%rd5, 0")
	p.op("mov.u64", "%%rd40, -7046029254386353131")
	p.op("mov.u64", "%%rd41, -49064778989728563")
	p.op("mov.u64", "%%rd42, -4265267296055464877")

	p.label("RANGE", "for (d = blockIdx.x; d < count; d += gridDim.x): %rd7 = src, %rd8 = dst, %rd9 = len, %rd10 = sum")
	p.op("setp.ge.u32", "%%p2, %%r2, %%r1")
	p.op("@%p2 bra", "DONE")
	p.op("mul.wide.u32", "%%rd6, %%r2, 32")
	p.op("add.s64", "%%rd6, %%rd1, %%rd6")
	p.op("ld.global.v2.u64", "{%%rd7, %%rd8}, [%%rd6]")
	p.op("ld.global.v2.u64", "{%%rd9, %%rd10}, [%%rd6+16]")
	p.comment("%rd11 = ext, %rd12 = w0 = (ext - base) / 8, %rd13 = done")
	p.op("selp.b64", "%%rd11, %%rd7, %%rd8, %%p1")
	p.op("sub.u64", "%%rd12, %%rd11, %%rd2")
	p.op("shr.u64", "%%rd12, %%rd12, 3")
	p.op("cvta.to.global.u64", "%%rd7, %%rd7")
	p.op("cvta.to.global.u64", "%%rd8, %%rd8")
	p.op("cvta.to.global.u64", "%%rd11, %%rd11")
	p.op("mov.u64", "%%rd13, 0")
	p.comment("if (((src | dst) & 15) == 0) {")
	p.op("or.b64", "%%rd14, %%rd7, %%rd8")
	p.op("and.b64", "%%rd14, %%rd14, 15")
	p.op("setp.ne.u64", "%%p3, %%rd14, 0")
	p.op("@%p3 bra", "BYTES")
	p.comment("%rd15 = nv, %rd16 = k, %rd17 = key = (w0 + 2k + 1) * PHI, %rd18 = step = 2 nt PHI,")
	p.comment("%rd19 = 3 nt, %rd20 = 16 nt (bytes per step of nt), %rd21 = 4 nt")
	p.op("shr.u64", "%%rd15, %%rd9, 4")
	p.op("mov.u64", "%%rd16, %%rd3")
	p.op("shl.b64", "%%rd17, %%rd3, 1")
	p.op("add.u64", "%%rd17, %%rd17, %%rd12")
	p.op("add.u64", "%%rd17, %%rd17, 1")
	p.op("mul.lo.u64", "%%rd17, %%rd17, %%rd40")
	p.op("shl.b64", "%%rd18, %%rd4, 1")
	p.op("mul.lo.u64", "%%rd18, %%rd18, %%rd40")
	p.op("mul.lo.u64", "%%rd19, %%rd4, 3")
	p.op("shl.b64", "%%rd20, %%rd4, 4")
	p.op("shl.b64", "%%rd21, %%rd4, 2")

	p.label("VEC4", "for (; k + 3 nt < nv; k += 4 nt): %rd24..%rd27 the four addresses, %rd28..%rd35 the eight words")
	p.op("add.u64", "%%rd23, %%rd16, %%rd19")
	p.op("setp.ge.u64", "%%p4, %%rd23, %%rd15")
	p.op("@%p4 bra", "VEC1")
	p.op("shl.b64", "%%rd23, %%rd16, 4")
	p.op("add.s64", "%%rd24, %%rd7, %%rd23")
	for i := 25; i <= 27; i++ {
		p.op("add.s64", "%%rd%d, %%rd%d, %%rd20", i, i-1)
	}
	for i := range 4 {
		p.op("ld.global.v2.u64", "{%%rd%d, %%rd%d}, [%%rd%d]", 28+2*i, 29+2*i, 24+i)
	}
	p.op("add.s64", "%%rd24, %%rd8, %%rd23")
	for i := 25; i <= 27; i++ {
		p.op("add.s64", "%%rd%d, %%rd%d, %%rd20", i, i-1)
	}
	for i := range 4 {
		p.op("st.global.v2.u64", "[%%rd%d], {%%rd%d, %%rd%d}", 24+i, 28+2*i, 29+2*i)
	}
	p.comment("word 2k + 2j nt (+1) adds key + j step (+ PHI); %rd36 = the key of each")
	p.op("mov.u64", "%%rd36, %%rd17")
	for i := range 4 {
		if i > 0 {
			p.op("add.u64", "%%rd36, %%rd36, %%rd18")
		}
		p.op("add.u64", "%%rd%d, %%rd%d, %%rd36", 28+2*i, 28+2*i)
		p.op("add.u64", "%%rd43, %%rd36, %%rd40")
		p.op("add.u64", "%%rd%d, %%rd%d, %%rd43", 29+2*i, 29+2*i)
	}
	var words []string
	for i := 28; i <= 35; i++ {
		words = append(words, fmt.Sprintf("%%rd%d", i))
	}
	p.fmix64(words...)
	for _, w := range words {
		p.op("add.u64", "%%rd5, %%rd5, %s", w)
	}
	p.op("add.u64", "%%rd16, %%rd16, %%rd21")
	p.op("add.u64", "%%rd36, %%rd36, %%rd18")
	p.op("mov.u64", "%%rd17, %%rd36")
	p.op("bra.uni", "VEC4")

	p.label("VEC1", "for (; k < nv; k += nt)")
	p.op("setp.ge.u64", "%%p4, %%rd16, %%rd15")
	p.op("@%p4 bra", "VECEND")
	p.op("shl.b64", "%%rd23, %%rd16, 4")
	p.op("add.s64", "%%rd24, %%rd7, %%rd23")
	p.op("ld.global.v2.u64", "{%%rd28, %%rd29}, [%%rd24]")
	p.op("add.s64", "%%rd24, %%rd8, %%rd23")
	p.op("st.global.v2.u64", "[%%rd24], {%%rd28, %%rd29}")
	p.op("add.u64", "%%rd28, %%rd28, %%rd17")
	p.op("add.u64", "%%rd43, %%rd17, %%rd40")
	p.op("add.u64", "%%rd29, %%rd29, %%rd43")
	p.fmix64("%rd28", "%rd29")
	p.op("add.u64", "%%rd5, %%rd5, %%rd28")
	p.op("add.u64", "%%rd5, %%rd5, %%rd29")
	p.op("add.u64", "%%rd16, %%rd16, %%rd4")
	p.op("add.u64", "%%rd17, %%rd17, %%rd18")
	p.op("bra.uni", "VEC1")
	p.label("VECEND", "done = nv * 16")
	p.op("shl.b64", "%%rd13, %%rd15, 4")

	p.label("BYTES", "for (k = done + t; k < len; k += nt) dst[k] = src[k]")
	p.op("add.u64", "%%rd23, %%rd13, %%rd3")
	p.label("BYTE", "")
	p.op("setp.ge.u64", "%%p4, %%rd23, %%rd9")
	p.op("@%p4 bra", "WORDS")
	p.op("add.s64", "%%rd24, %%rd7, %%rd23")
	p.op("ld.global.u8", "%%b, [%%rd24]")
	p.op("add.s64", "%%rd24, %%rd8, %%rd23")
	p.op("st.global.u8", "[%%rd24], %%b")
	p.op("add.u64", "%%rd23, %%rd23, %%rd4")
	p.op("bra.uni", "BYTE")

	p.label("WORDS", "for (i = done / 8 + t; i < (sum + 7) / 8; i += nt): %rd24 = i, %rd25 = (sum + 7) / 8")
	p.op("shr.u64", "%%rd24, %%rd13, 3")
	p.op("add.u64", "%%rd24, %%rd24, %%rd3")
	p.op("add.u64", "%%rd25, %%rd10, 7")
	p.op("shr.u64", "%%rd25, %%rd25, 3")
	p.label("WORD", "%rd26 = lo, %rd27 = hi, %rd28 = w, %rd29 = from")
	p.op("setp.ge.u64", "%%p4, %%rd24, %%rd25")
	p.op("@%p4 bra", "NEXT")
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
	p.op("mul.lo.u64", "%%rd30, %%rd30, %%rd40")
	p.op("add.u64", "%%rd28, %%rd28, %%rd30")
	p.fmix64("%rd28")
	p.op("add.u64", "%%rd5, %%rd5, %%rd28")
	p.op("add.u64", "%%rd24, %%rd24, %%rd4")
	p.op("bra.uni", "WORD")

	p.label("NEXT", "the block's next range")
	p.op("add.u32", "%%r2, %%r2, %%r3")
	p.op("bra.uni", "RANGE")

	p.label("DONE", "red.global.add.u64 slots[g % 256], s")
	p.op("ld.param.u64", "%%rd44, [%s_slots]", e)
	p.op("cvta.to.global.u64", "%%rd44, %%rd44")
	p.op("mov.u32", "%%r5, %%ctaid.x")
	p.op("mov.u32", "%%r6, %%ntid.x")
	p.op("mul.wide.u32", "%%rd45, %%r5, %%r6")
	p.op("add.u64", "%%rd45, %%rd45, %%rd3")
	p.op("and.b64", "%%rd45, %%rd45, 255")
	p.op("shl.b64", "%%rd45, %%rd45, 3")
	p.op("add.s64", "%%rd45, %%rd44, %%rd45")
	p.op("red.global.add.u64", "[%%rd45], %%rd5")
	p.line("\tret;")
	p.line("}")
	return p.b.String()
}
