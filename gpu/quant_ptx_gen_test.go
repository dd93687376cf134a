package gpu

// genQuant writes quant.ptx, the kernel of Quantizer. It is generated
// because the element load (three dtypes) is needed by both passes over a
// block, and reads better written once, as the Go below.
func genQuant() string {
	var p ptxText
	p.header("genQuant in quant_ptx_gen_test.go", `
quant.ptx: the FP8 block quantization kernel of Quantizer. One thread
block of 256 threads per 128x128 block of a [rows, cols] weight of F32,
BF16 or F16: the block's amax, its scale, then the float8_e4m3fn codes of
the block's elements that lie in [first, end) (flat, row-major indices),
with integer arithmetic and IEEE division only, so that it reproduces
package quant bit for bit (and torch's (W.float() / s).to(float8_e4m3fn),
which does not saturate: cvt.rn.satfinite.e4m3x2 would). It is this CUDA C:

  __device__ unsigned widen(const void *w, unsigned long long e, unsigned kind) {
    // kind 1: F32, 2: BF16, 3: F16 (f16_to_f32 as in cast.ptx: exact)
    return kind == 1 ? ((const unsigned *)w)[e]
         : kind == 2 ? (unsigned)((const unsigned short *)w)[e] << 16
         : f16_to_f32(((const unsigned short *)w)[e]);
  }
  __device__ unsigned e4m3(unsigned f) {  // quant.EncodeE4M3
    unsigned sign = (f >> 24) & 0x80, a = f & 0x7FFFFFFF;
    unsigned normal = (a + 0xC4000000 + 0x7FFFF + ((a >> 20) & 1)) >> 20;
    // below 2^-6: round |f| / 2^-9 to nearest even; shifts of 32 or more
    // give 0, as in PTX
    unsigned e = a >> 23, m = (a & 0x7FFFFF) | (e != 0 ? 0x800000 : 0);
    unsigned sh = 141 - max(e, 1);
    unsigned sub = (m + (shl(1, sh - 1) - 1) + (shr(m, sh) & 1)) >> sh;
    return sign | (a >= 0x43F00000 ? 0x7F : a < 0x3C800000 ? sub : normal);
  }
  extern "C" __global__ void __launch_bounds__(256) wc_quant(const void *src,
      unsigned char *dst, unsigned *scales, unsigned long long first,
      unsigned long long end, unsigned rows, unsigned cols, unsigned br0, unsigned kind) {
    __shared__ unsigned warps[8];
    unsigned nbc = (cols + 127) >> 7, nbr = (rows + 127) >> 7;
    unsigned br = br0 + blockIdx.x / nbc, bc = blockIdx.x % nbc;
    if (br >= nbr) return;
    unsigned c = threadIdx.x & 127, r0 = threadIdx.x >> 7;
    unsigned h = min(128, rows - br * 128), w = min(128, cols - bc * 128);
    unsigned long long e0 = (unsigned long long)(br * 128 + r0) * cols + bc * 128 + c;
    unsigned m = 0;
    if (c < w)
      for (unsigned r = r0, e = e0; r < h; r += 2, e += 2 * cols)
        m = max(m, widen(src, e, kind) & 0x7FFFFFFF);
    for (int i = 16; i >= 1; i /= 2) m = max(m, __shfl_xor_sync(~0u, m, i));
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = m;
    __syncthreads();
    for (int i = 0; i < 8; i++) m = max(m, warps[i]);
    unsigned s = __float_as_uint(__fdiv_rn(__uint_as_float(m), 448.0f));  // quant.ScaleOf
    s = m >= 0x7F800000 ? 0x7FC00000 : s < 0x00800000 ? 0x3F800000 : s;
    if (threadIdx.x == 0) scales[br * nbc + bc] = s;
    if (c < w)
      for (unsigned r = r0, e = e0; r < h && e < end; r += 2, e += 2 * cols)
        if (e >= first)  // quant.EncodeScaled
          dst[e - first] = s == 0x7FC00000 ? 0x7F
                         : e4m3(__float_as_uint(__fdiv_rn(__uint_as_float(widen(src, e, kind)), __uint_as_float(s))));
  }
`)
	p.params("wc_quant", "u64 src", "u64 dst", "u64 scales", "u64 first", "u64 end",
		"u32 rows", "u32 cols", "u32 br0", "u32 kind")
	p.line(".maxntid 256, 1, 1")
	p.line("{")
	p.line("\t.reg .pred\t%%p<12>;")
	p.line("\t.reg .b32\t%%r<40>;")
	p.line("\t.reg .b64\t%%rd<16>;")
	p.line("\t.shared .align 4 .b8 wc_quant_warps[32];")
	p.line("")
	p.comment("%rd1 = src, %rd2 = dst, %rd3 = scales, %rd4 = first, %rd5 = end,")
	p.comment("%r1 = rows, %r2 = cols, %r3 = br0, %r4 = kind")
	for i, n := range []string{"src", "dst", "scales", "first", "end"} {
		p.op("ld.param.u64", "%%rd%d, [wc_quant_%s]", i+1, n)
	}
	for i, n := range []string{"rows", "cols", "br0", "kind"} {
		p.op("ld.param.u32", "%%r%d, [wc_quant_%s]", i+1, n)
	}
	for i := 1; i <= 3; i++ {
		p.op("cvta.to.global.u64", "%%rd%d, %%rd%d", i, i)
	}
	p.comment("%r5 = nbc, %r6 = nbr, %r7 = br, %r8 = bc")
	p.op("add.u32", "%%r5, %%r2, 127")
	p.op("shr.u32", "%%r5, %%r5, 7")
	p.op("add.u32", "%%r6, %%r1, 127")
	p.op("shr.u32", "%%r6, %%r6, 7")
	p.op("mov.u32", "%%r9, %%ctaid.x")
	p.op("div.u32", "%%r7, %%r9, %%r5")
	p.op("rem.u32", "%%r8, %%r9, %%r5")
	p.op("add.u32", "%%r7, %%r7, %%r3")
	p.op("setp.ge.u32", "%%p1, %%r7, %%r6")
	p.op("@%p1 bra", "DONE")
	p.comment("%r10 = threadIdx.x, %r11 = c, %r12 = r0, %r13 = br*128, %r14 = bc*128")
	p.op("mov.u32", "%%r10, %%tid.x")
	p.op("and.b32", "%%r11, %%r10, 127")
	p.op("shr.u32", "%%r12, %%r10, 7")
	p.op("shl.b32", "%%r13, %%r7, 7")
	p.op("shl.b32", "%%r14, %%r8, 7")
	p.comment("%r15 = h, %r16 = w; %p2: c < w")
	p.op("sub.u32", "%%r15, %%r1, %%r13")
	p.op("min.u32", "%%r15, %%r15, 128")
	p.op("sub.u32", "%%r16, %%r2, %%r14")
	p.op("min.u32", "%%r16, %%r16, 128")
	p.op("setp.lt.u32", "%%p2, %%r11, %%r16")
	p.comment("%rd6 = e0, %rd7 = 2*cols (the next row of this thread)")
	p.op("add.u32", "%%r17, %%r13, %%r12")
	p.op("mul.wide.u32", "%%rd6, %%r17, %%r2")
	p.op("add.u32", "%%r17, %%r14, %%r11")
	p.op("cvt.u64.u32", "%%rd7, %%r17")
	p.op("add.u64", "%%rd6, %%rd6, %%rd7")
	p.op("mul.wide.u32", "%%rd7, %%r2, 2")
	p.comment("%p3: F32, %p4: BF16 (else F16); %rd8 = bytes per element")
	p.op("setp.eq.u32", "%%p3, %%r4, 1")
	p.op("setp.eq.u32", "%%p4, %%r4, 2")
	p.op("selp.b64", "%%rd8, 4, 2, %%p3")
	p.line("")
	p.comment("pass 1: %r20 = m, the amax bits of this thread's elements")
	p.op("mov.u32", "%%r20, 0")
	p.op("@!%p2 bra", "REDUCE")
	p.op("mov.u32", "%%r21, %%r12")
	p.op("mov.u64", "%%rd9, %%rd6")
	p.label("AMAX", "for (r = r0, e = e0; r < h; r += 2, e += 2*cols)")
	p.op("setp.ge.u32", "%%p5, %%r21, %%r15")
	p.op("@%p5 bra", "REDUCE")
	quantWiden(&p, "A")
	p.op("and.b32", "%%r22, %%r22, 0x7FFFFFFF")
	p.op("max.u32", "%%r20, %%r20, %%r22")
	p.op("add.u32", "%%r21, %%r21, 2")
	p.op("add.u64", "%%rd9, %%rd9, %%rd7")
	p.op("bra.uni", "AMAX")
	p.label("REDUCE", "m = max over the warp, then over the block's 8 warps")
	for _, lanes := range []int{16, 8, 4, 2, 1} {
		p.op("shfl.sync.bfly.b32", "%%r23, %%r20, %d, 31, 0xffffffff", lanes)
		p.op("max.u32", "%%r20, %%r20, %%r23")
	}
	p.op("and.b32", "%%r24, %%r10, 31")
	p.op("setp.ne.u32", "%%p6, %%r24, 0")
	p.op("@%p6 bra", "WAIT")
	p.op("mov.u32", "%%r25, wc_quant_warps")
	p.op("shr.u32", "%%r26, %%r10, 5")
	p.op("shl.b32", "%%r26, %%r26, 2")
	p.op("add.u32", "%%r25, %%r25, %%r26")
	p.op("st.shared.u32", "[%%r25], %%r20")
	p.label("WAIT", "")
	p.op("bar.sync", "0")
	p.op("mov.u32", "%%r25, wc_quant_warps")
	for w := range 8 {
		p.op("ld.shared.u32", "%%r23, [%%r25+%d]", 4*w)
		p.op("max.u32", "%%r20, %%r20, %%r23")
	}
	p.comment("%r27 = s: NaN for a block with a NaN or Inf (%p8), m/448, or 1 below 2^-126")
	p.op("mov.b32", "%%r28, 0x43E00000") // 448.0f
	p.op("div.rn.f32", "%%r27, %%r20, %%r28")
	p.op("setp.lt.u32", "%%p7, %%r27, 0x00800000")
	p.op("selp.b32", "%%r27, 0x3F800000, %%r27, %%p7")
	p.op("setp.ge.u32", "%%p8, %%r20, 0x7F800000")
	p.op("selp.b32", "%%r27, 0x7FC00000, %%r27, %%p8")
	p.op("setp.ne.u32", "%%p6, %%r10, 0")
	p.op("@%p6 bra", "CODES")
	p.comment("scales[br*nbc + bc] = s")
	p.op("mul.wide.u32", "%%rd10, %%r7, %%r5")
	p.op("cvt.u64.u32", "%%rd11, %%r8")
	p.op("add.u64", "%%rd10, %%rd10, %%rd11")
	p.op("shl.b64", "%%rd10, %%rd10, 2")
	p.op("add.s64", "%%rd10, %%rd3, %%rd10")
	p.op("st.global.u32", "[%%rd10], %%r27")
	p.label("CODES", "pass 2: the codes of the elements in [first, end)")
	p.op("@!%p2 bra", "DONE")
	p.op("mov.u32", "%%r21, %%r12")
	p.op("mov.u64", "%%rd9, %%rd6")
	p.label("CODE", "")
	p.op("setp.ge.u32", "%%p5, %%r21, %%r15")
	p.op("@%p5 bra", "DONE")
	p.op("setp.ge.u64", "%%p5, %%rd9, %%rd5")
	p.op("@%p5 bra", "DONE")
	p.op("setp.lt.u64", "%%p5, %%rd9, %%rd4")
	p.op("@%p5 bra", "NEXT")
	p.op("mov.u32", "%%r30, 127")
	p.op("@%p8 bra", "STORE")
	quantWiden(&p, "C")
	p.op("div.rn.f32", "%%r31, %%r22, %%r27")
	p.comment("%r30 = e4m3(%r31): %r32 = sign, %r33 = a, %r35 = normal, %r37 = sub")
	p.op("shr.u32", "%%r32, %%r31, 24")
	p.op("and.b32", "%%r32, %%r32, 128")
	p.op("and.b32", "%%r33, %%r31, 0x7FFFFFFF")
	p.op("shr.u32", "%%r34, %%r33, 20")
	p.op("and.b32", "%%r34, %%r34, 1")
	p.op("add.u32", "%%r35, %%r33, 0xC407FFFF")
	p.op("add.u32", "%%r35, %%r35, %%r34")
	p.op("shr.u32", "%%r35, %%r35, 20")
	p.op("shr.u32", "%%r36, %%r33, 23")
	p.op("and.b32", "%%r37, %%r33, 0x7FFFFF")
	p.op("setp.ne.u32", "%%p9, %%r36, 0")
	p.op("selp.b32", "%%r38, 0x800000, 0, %%p9")
	p.op("or.b32", "%%r37, %%r37, %%r38")
	p.op("max.u32", "%%r36, %%r36, 1")
	p.op("mov.u32", "%%r38, 141")
	p.op("sub.u32", "%%r36, %%r38, %%r36")
	p.op("sub.u32", "%%r38, %%r36, 1")
	p.op("mov.u32", "%%r39, 1")
	p.op("shl.b32", "%%r38, %%r39, %%r38")
	p.op("sub.u32", "%%r38, %%r38, 1")
	p.op("shr.u32", "%%r39, %%r37, %%r36")
	p.op("and.b32", "%%r39, %%r39, 1")
	p.op("add.u32", "%%r37, %%r37, %%r38")
	p.op("add.u32", "%%r37, %%r37, %%r39")
	p.op("shr.u32", "%%r37, %%r37, %%r36")
	p.op("setp.lt.u32", "%%p9, %%r33, 0x3C800000")
	p.op("selp.b32", "%%r35, %%r37, %%r35, %%p9")
	p.op("setp.ge.u32", "%%p9, %%r33, 0x43F00000")
	p.op("selp.b32", "%%r35, 127, %%r35, %%p9")
	p.op("or.b32", "%%r30, %%r32, %%r35")
	p.label("STORE", "dst[e - first] = %r30")
	p.op("sub.u64", "%%rd12, %%rd9, %%rd4")
	p.op("add.s64", "%%rd12, %%rd2, %%rd12")
	p.op("st.global.u8", "[%%rd12], %%r30")
	p.label("NEXT", "")
	p.op("add.u32", "%%r21, %%r21, 2")
	p.op("add.u64", "%%rd9, %%rd9, %%rd7")
	p.op("bra.uni", "CODE")
	p.label("DONE", "")
	p.line("\tret;")
	p.line("}")
	return p.b.String()
}

// quantWiden writes %r22 = widen(src, e = %rd9, kind): the float32 bits of
// the element, loaded as F32, BF16 or F16 (%p3, %p4). tag keeps the labels
// of each copy apart.
func quantWiden(p *ptxText, tag string) {
	w32, bf, done := "W32"+tag, "WBF"+tag, "WIDE"+tag
	p.op("mul.lo.u64", "%%rd13, %%rd9, %%rd8")
	p.op("add.s64", "%%rd13, %%rd1, %%rd13")
	p.op("@%p3 bra", "%s", w32)
	p.op("ld.global.u16", "%%r22, [%%rd13]")
	p.op("@%p4 bra", "%s", bf)
	p.comment("f16_to_f32, as in cast.ptx")
	p.op("and.b32", "%%r32, %%r22, 32768")
	p.op("shl.b32", "%%r32, %%r32, 16")
	p.op("and.b32", "%%r33, %%r22, 32767")
	p.op("shr.u32", "%%r34, %%r33, 10")
	p.op("and.b32", "%%r35, %%r22, 1023")
	p.op("shl.b32", "%%r36, %%r33, 13")
	p.op("add.u32", "%%r37, %%r36, 0x38000000")
	p.op("add.u32", "%%r36, %%r36, 0x70000000")
	p.op("clz.b32", "%%r38, %%r35")
	p.op("sub.u32", "%%r39, %%r38, 8")
	p.op("shl.b32", "%%r39, %%r35, %%r39")
	p.op("sub.u32", "%%r38, %%r38, 133")
	p.op("shl.b32", "%%r38, %%r38, 23")
	p.op("sub.u32", "%%r39, %%r39, %%r38")
	p.op("setp.eq.u32", "%%p10, %%r35, 0")
	p.op("selp.b32", "%%r39, 0, %%r39, %%p10")
	p.op("setp.eq.u32", "%%p10, %%r34, 0")
	p.op("selp.b32", "%%r37, %%r39, %%r37, %%p10")
	p.op("setp.eq.u32", "%%p10, %%r34, 31")
	p.op("selp.b32", "%%r37, %%r36, %%r37, %%p10")
	p.op("or.b32", "%%r22, %%r32, %%r37")
	p.op("bra", "%s", done)
	p.label(bf, "")
	p.op("shl.b32", "%%r22, %%r22, 16")
	p.op("bra", "%s", done)
	p.label(w32, "")
	p.op("ld.global.u32", "%%r22, [%%rd13]")
	p.label(done, "")
}
