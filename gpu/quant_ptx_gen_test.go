package gpu

import "fmt"

// genQuant writes quant.ptx, the kernel of Quantizer: its vector path
// converts with the GPU's FP8 converter (quantFastConv in
// quant_conv_ptx_gen_test.go). It is generated because the element load
// (three dtypes) is needed by both passes over a block, and reads better
// written once, as the Go below.
func genQuant() string { return genQuantKernel(true) }

// genQuantInt writes quant_int.ptx, the kernel Quantizer falls back to
// where quant.ptx fails to load or its self-test: the same kernel with
// the vector path of integer arithmetic (quantFast below) that quant.ptx
// had before the converter.
func genQuantInt() string { return genQuantKernel(false) }

// genQuantKernel writes quant.ptx (conv) or quant_int.ptx.
func genQuantKernel(conv bool) string {
	var p ptxText
	if conv {
		p.header("genQuant in quant_ptx_gen_test.go", quantConvHeader+quantScalarC)
	} else {
		p.header("genQuantInt in quant_ptx_gen_test.go", quantIntHeader+quantScalarC)
	}
	p.params("wc_quant", "u64 src", "u64 dst", "u64 scales", "u64 first", "u64 end",
		"u32 rows", "u32 cols", "u32 br0", "u32 kind")
	p.line(".maxntid 256, 1, 1")
	p.line("{")
	p.line("\t.reg .pred\t%%p<16>;")
	p.line("\t.reg .b32\t%%r<60>;")
	p.line("\t.reg .b64\t%%rd<32>;")
	p.line("\t.reg .b32\t%%v<32>;")
	if conv {
		p.line("\t.reg .b16\t%%h<4>;")
	} else {
		p.line("\t.reg .b32\t%%c<8>;")
	}
	p.line("\t.shared .align 4 .b8 wc_quant_warps[32];")
	p.line("")
	genQuantBody(&p)
	if conv {
		quantFastConv(&p, "BF")
		quantFastConv(&p, "FH")
	} else {
		quantFast(&p, "BF")
		quantFast(&p, "FH")
	}
	p.line("}")
	return p.b.String()
}

// quantIntHeader opens quant_int.ptx's comment.
const quantIntHeader = `
quant_int.ptx: the FP8 block quantization kernel that Quantizer falls back
to where quant.ptx (the same kernel, its vector path converting with the
GPU's FP8 converter) fails to load or its self-test. One thread
block of 256 threads per 128x128 block of a [rows, cols] weight of F32,
BF16 or F16: the block's amax, its scale, then the float8_e4m3fn codes of
the block's elements that lie in [first, end) (flat, row-major indices),
with integer arithmetic and IEEE arithmetic only, so that it reproduces
package quant bit for bit (and torch's (W.float() / s).to(float8_e4m3fn),
which does not saturate: cvt.rn.satfinite.e4m3x2 would). A full block of
BF16 or F16 whose rows start 16-byte aligned takes a vector path (quantFast
below): each thread loads 64 elements with eight 16-byte loads, the amax
comes from registers (the 15 magnitude bits), the codes are encoded from
the same registers (the subnormal codes as round(|q| * 2^9) by float
arithmetic) and stored 8 bytes at a time where the whole block lies in
[first, end) and dst - first is 8-byte aligned, else byte by byte. Every
other block takes the scalar path, this CUDA C:
`

// quantScalarC is the CUDA C of the kernels' scalar path, at the end of
// their opening comments.
const quantScalarC = `
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
`

// genQuantBody writes the kernel's parameters' loads, the block's
// coordinates, the dispatch to the vector path and the scalar path.
func genQuantBody(p *ptxText) {
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
	quantFastDispatch(p)
	p.label("SCALAR", "")
	p.comment("pass 1: %r20 = m, the amax bits of this thread's elements")
	p.op("mov.u32", "%%r20, 0")
	p.op("@!%p2 bra", "REDUCE")
	p.op("mov.u32", "%%r21, %%r12")
	p.op("mov.u64", "%%rd9, %%rd6")
	p.label("AMAX", "for (r = r0, e = e0; r < h; r += 2, e += 2*cols)")
	p.op("setp.ge.u32", "%%p5, %%r21, %%r15")
	p.op("@%p5 bra", "REDUCE")
	quantWiden(p, "A")
	p.op("and.b32", "%%r22, %%r22, 0x7FFFFFFF")
	p.op("max.u32", "%%r20, %%r20, %%r22")
	p.op("add.u32", "%%r21, %%r21, 2")
	p.op("add.u64", "%%rd9, %%rd9, %%rd7")
	p.op("bra.uni", "AMAX")
	p.label("REDUCE", "m = max over the warp, then over the block's 8 warps")
	quantReduce(p, "")
	quantScale(p, "CODES")
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
	quantWiden(p, "C")
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
}

// quantFastDispatch branches to the vector path of a full 128x128 block of
// BF16 (FASTBF) or F16 (FASTFH) whose rows start 16-byte aligned (the
// weight's address a multiple of 16, cols of 8); every other block falls
// through to the scalar path. The test is uniform over the thread block.
func quantFastDispatch(p *ptxText) {
	p.comment("the vector path: a full block of 2-byte elements, rows 16-byte aligned")
	p.op("setp.ne.u32", "%%p11, %%r15, 128")
	p.op("@%p11 bra", "SCALAR")
	p.op("setp.ne.u32", "%%p11, %%r16, 128")
	p.op("@%p11 bra", "SCALAR")
	p.op("@%p3 bra", "SCALAR")
	p.op("and.b32", "%%r40, %%r2, 7")
	p.op("setp.ne.u32", "%%p11, %%r40, 0")
	p.op("@%p11 bra", "SCALAR")
	p.op("and.b64", "%%rd20, %%rd1, 15")
	p.op("setp.ne.u64", "%%p11, %%rd20, 0")
	p.op("@%p11 bra", "SCALAR")
	p.op("@%p4 bra", "FASTBF")
	p.op("bra", "FASTFH")
}

// quantFast writes the vector path of one 2-byte dtype (tag BF: BF16, FH:
// F16). Each thread holds 64 elements in %v0..%v31: chunk i (0..7) of 8
// elements, 16 bytes loaded at once, is row 16i + tid/16 of the block,
// columns 8*(tid%16) on, so that a warp reads two rows of 256 bytes. amax
// comes from the registers (the elements' 15 magnitude bits, whose order
// is that of their float32 values, NaNs above infinities above finite
// values), reduced as in the scalar path; the codes are encoded from the
// registers too and stored 8 at a time (st.global.v2.u32) where the whole
// block lies in [first, end) and dst - first is a multiple of 8, else
// byte by byte, each checked against the range.
func quantFast(p *ptxText, tag string) {
	L := func(n string) string { return n + tag }
	quantFastLoad(p, tag)
	p.comment("%r20 = the largest low half's magnitude, %r44 the high halves'")
	p.op("mov.u32", "%%r20, 0")
	p.op("mov.u32", "%%r44, 0")
	for v := range 32 {
		p.op("and.b32", "%%r23, %%v%d, 0x7FFF", v)
		p.op("max.u32", "%%r20, %%r20, %%r23")
		p.op("and.b32", "%%r23, %%v%d, 0x7FFF0000", v)
		p.op("max.u32", "%%r44, %%r44, %%r23")
	}
	p.op("shr.u32", "%%r44, %%r44, 16")
	p.op("max.u32", "%%r20, %%r20, %%r44")
	quantReduce(p, tag)
	quantWidenAmax(p, tag)
	quantScale(p, L("FCODES"))
	p.label(L("FCODES"), "the codes, from the registers")
	quantFastRange(p)
	p.op("mov.b32", "%%r48, 0x44000000") // 512.0f
	p.op("mov.b32", "%%r49, 0x4B000000") // 2^23
	for i := range 8 {
		for j := range 8 {
			v := fmt.Sprintf("%%v%d", 4*i+j/2)
			switch {
			case tag == "BF" && j%2 == 0:
				p.op("shl.b32", "%%r22, %s, 16", v)
			case tag == "BF":
				p.op("and.b32", "%%r22, %s, 0xFFFF0000", v)
			case j%2 == 0:
				p.op("and.b32", "%%r22, %s, 0xFFFF", v)
			default:
				p.op("shr.u32", "%%r22, %s, 16", v)
			}
			if tag == "FH" {
				quantF16(p)
			}
			p.op("div.rn.f32", "%%r31, %%r22, %%r27")
			quantE4M3(p, fmt.Sprintf("%%c%d", j))
		}
		if i == 0 {
			p.comment("a NaN or Inf block: every code 0x7F")
		}
		for j := range 8 {
			p.op("@%p8 mov.u32", "%%c%d, 127", j)
		}
		p.op("prmt.b32", "%%r50, %%c0, %%c1, 0x0040")
		p.op("prmt.b32", "%%r51, %%c2, %%c3, 0x0040")
		p.op("prmt.b32", "%%r52, %%r50, %%r51, 0x5410")
		p.op("prmt.b32", "%%r50, %%c4, %%c5, 0x0040")
		p.op("prmt.b32", "%%r51, %%c6, %%c7, 0x0040")
		p.op("prmt.b32", "%%r53, %%r50, %%r51, 0x5410")
		bytes, next := fmt.Sprintf("%s%d", L("BYTES"), i), fmt.Sprintf("%s%d", L("CHUNK"), i)
		p.op("@!%p12 bra", "%s", bytes)
		p.op("st.global.v2.u32", "[%%rd28], {%%r52, %%r53}")
		p.op("bra", "%s", next)
		p.label(bytes, "each code in [first, end) alone")
		for j := range 8 {
			skip := fmt.Sprintf("%s%d_%d", L("SKIP"), i, j)
			p.op("add.u64", "%%rd29, %%rd20, %d", j)
			p.op("setp.lt.u64", "%%p13, %%rd29, %%rd4")
			p.op("@%p13 bra", "%s", skip)
			p.op("setp.ge.u64", "%%p13, %%rd29, %%rd5")
			p.op("@%p13 bra", "%s", skip)
			p.op("st.global.u8", "[%%rd28+%d], %%c%d", j, j)
			p.label(skip, "")
		}
		p.label(next, "")
		if i < 7 {
			p.op("add.u64", "%%rd20, %%rd20, %%rd22")
			p.op("add.u64", "%%rd28, %%rd28, %%rd22")
		}
	}
	p.line("\tret;")
}

// quantFastLoad writes the vector path's label and loads: %rd20 = e, the
// element of the thread's first chunk, %rd22 = 16*cols, and the 64
// elements in %v0..%v31 (quantFast says how they lie).
func quantFastLoad(p *ptxText, tag string) {
	p.label("FAST"+tag, "")
	p.comment("%rd20 = e, this thread's first element; %rd22 = 16*cols (the next chunk)")
	p.op("shr.u32", "%%r40, %%r10, 4")
	p.op("and.b32", "%%r41, %%r10, 15")
	p.op("shl.b32", "%%r41, %%r41, 3")
	p.op("add.u32", "%%r42, %%r13, %%r40")
	p.op("mul.wide.u32", "%%rd20, %%r42, %%r2")
	p.op("add.u32", "%%r43, %%r14, %%r41")
	p.op("cvt.u64.u32", "%%rd21, %%r43")
	p.op("add.u64", "%%rd20, %%rd20, %%rd21")
	p.op("mul.wide.u32", "%%rd22, %%r2, 16")
	p.op("shl.b64", "%%rd23, %%rd20, 1")
	p.op("add.s64", "%%rd23, %%rd1, %%rd23")
	p.op("shl.b64", "%%rd24, %%rd22, 1")
	for i := range 8 {
		p.op("ld.global.nc.v4.u32", "{%%v%d, %%v%d, %%v%d, %%v%d}, [%%rd23]", 4*i, 4*i+1, 4*i+2, 4*i+3)
		if i < 7 {
			p.op("add.s64", "%%rd23, %%rd23, %%rd24")
		}
	}
}

// quantWidenAmax writes %r20 = the block's amax, the 15 magnitude bits of
// a BF16 (tag BF) or F16 in %r20, widened to float32 bits.
func quantWidenAmax(p *ptxText, tag string) {
	p.comment("m widened to float32")
	if tag == "BF" {
		p.op("shl.b32", "%%r20, %%r20, 16")
	} else {
		p.op("mov.u32", "%%r22, %%r20")
		quantF16(p)
		p.op("mov.u32", "%%r20, %%r22")
	}
}

// quantFastRange writes the vector path's checks of the range: done where
// no element of the block lies in [first, end); %p12 where whole-block
// vector stores may be used; %rd28 = the address of the code of element
// %rd20.
func quantFastRange(p *ptxText) {
	p.comment("%rd25 = the block's first element, %rd26 its last; none in [first, end): done")
	p.op("mul.wide.u32", "%%rd25, %%r13, %%r2")
	p.op("cvt.u64.u32", "%%rd26, %%r14")
	p.op("add.u64", "%%rd25, %%rd25, %%rd26")
	p.op("mul.wide.u32", "%%rd26, %%r2, 127")
	p.op("add.u64", "%%rd26, %%rd26, %%rd25")
	p.op("add.u64", "%%rd26, %%rd26, 127")
	p.op("setp.ge.u64", "%%p12, %%rd25, %%rd5")
	p.op("@%p12 bra", "DONE")
	p.op("setp.lt.u64", "%%p12, %%rd26, %%rd4")
	p.op("@%p12 bra", "DONE")
	p.comment("%p12: whole-block vector stores (the block in [first, end), dst - first 8-byte aligned)")
	p.op("sub.u64", "%%rd27, %%rd2, %%rd4")
	p.op("and.b64", "%%rd28, %%rd27, 7")
	p.op("setp.eq.u64", "%%p12, %%rd28, 0")
	p.op("selp.b32", "%%r45, 1, 0, %%p12")
	p.op("setp.ge.u64", "%%p12, %%rd25, %%rd4")
	p.op("selp.b32", "%%r46, 1, 0, %%p12")
	p.op("and.b32", "%%r45, %%r45, %%r46")
	p.op("setp.lt.u64", "%%p12, %%rd26, %%rd5")
	p.op("selp.b32", "%%r46, 1, 0, %%p12")
	p.op("and.b32", "%%r45, %%r45, %%r46")
	p.op("setp.ne.u32", "%%p12, %%r45, 0")
	p.comment("%rd28 = the address of the code of element e (dst + e - first)")
	p.op("add.s64", "%%rd28, %%rd27, %%rd20")
}

// quantE4M3 writes dst = e4m3(%r31) for a quotient of a block whose scale
// is not NaN, as the scalar path's encoder but with the subnormal codes
// (|q| below 2^-6) from float arithmetic: round(|q| * 2^9) to nearest
// even, as the low bits of |q| * 512 + 2^23 (the product exact, a power
// of two; the sum rounded once, to an integer since it lies in [2^23,
// 2^24)). %r48 = 512.0, %r49 = 2^23.
func quantE4M3(p *ptxText, dst string) {
	p.op("shr.u32", "%%r32, %%r31, 24")
	p.op("and.b32", "%%r32, %%r32, 128")
	p.op("and.b32", "%%r33, %%r31, 0x7FFFFFFF")
	p.op("shr.u32", "%%r34, %%r33, 20")
	p.op("and.b32", "%%r34, %%r34, 1")
	p.op("add.u32", "%%r35, %%r33, 0xC407FFFF")
	p.op("add.u32", "%%r35, %%r35, %%r34")
	p.op("shr.u32", "%%r35, %%r35, 20")
	p.op("mul.rn.f32", "%%r37, %%r33, %%r48")
	p.op("add.rn.f32", "%%r37, %%r37, %%r49")
	p.op("sub.u32", "%%r37, %%r37, 0x4B000000")
	p.op("setp.lt.u32", "%%p9, %%r33, 0x3C800000")
	p.op("selp.b32", "%%r35, %%r37, %%r35, %%p9")
	p.op("setp.ge.u32", "%%p9, %%r33, 0x43F00000")
	p.op("selp.b32", "%%r35, 127, %%r35, %%p9")
	p.op("or.b32", "%s, %%r32, %%r35", dst)
}

// quantReduce writes m = the largest %r20 of the thread block's threads
// (butterfly shuffles over each warp, then its 8 warps through shared
// memory), into every thread's %r20; tag keeps its label apart.
func quantReduce(p *ptxText, tag string) {
	for _, lanes := range []int{16, 8, 4, 2, 1} {
		p.op("shfl.sync.bfly.b32", "%%r23, %%r20, %d, 31, 0xffffffff", lanes)
		p.op("max.u32", "%%r20, %%r20, %%r23")
	}
	p.op("and.b32", "%%r24, %%r10, 31")
	p.op("setp.ne.u32", "%%p6, %%r24, 0")
	p.op("@%p6 bra", "%s", "WAIT"+tag)
	p.op("mov.u32", "%%r25, wc_quant_warps")
	p.op("shr.u32", "%%r26, %%r10, 5")
	p.op("shl.b32", "%%r26, %%r26, 2")
	p.op("add.u32", "%%r25, %%r25, %%r26")
	p.op("st.shared.u32", "[%%r25], %%r20")
	p.label("WAIT"+tag, "")
	p.op("bar.sync", "0")
	p.op("mov.u32", "%%r25, wc_quant_warps")
	for w := range 8 {
		p.op("ld.shared.u32", "%%r23, [%%r25+%d]", 4*w)
		p.op("max.u32", "%%r20, %%r20, %%r23")
	}
}

// quantScale writes %r27 = s of the block's amax bits %r20 (%p8: a NaN or
// Inf block), which thread 0 stores in scales; then on to label next.
func quantScale(p *ptxText, next string) {
	p.comment("%r27 = s: NaN for a block with a NaN or Inf (%p8), m/448, or 1 below 2^-126")
	p.op("mov.b32", "%%r28, 0x43E00000") // 448.0f
	p.op("div.rn.f32", "%%r27, %%r20, %%r28")
	p.op("setp.lt.u32", "%%p7, %%r27, 0x00800000")
	p.op("selp.b32", "%%r27, 0x3F800000, %%r27, %%p7")
	p.op("setp.ge.u32", "%%p8, %%r20, 0x7F800000")
	p.op("selp.b32", "%%r27, 0x7FC00000, %%r27, %%p8")
	p.op("setp.ne.u32", "%%p6, %%r10, 0")
	p.op("@%p6 bra", "%s", next)
	p.comment("scales[br*nbc + bc] = s")
	p.op("mul.wide.u32", "%%rd10, %%r7, %%r5")
	p.op("cvt.u64.u32", "%%rd11, %%r8")
	p.op("add.u64", "%%rd10, %%rd10, %%rd11")
	p.op("shl.b64", "%%rd10, %%rd10, 2")
	p.op("add.s64", "%%rd10, %%rd3, %%rd10")
	p.op("st.global.u32", "[%%rd10], %%r27")
}

// quantF16 writes %r22 = the float32 bits of the F16 in %r22's low 16
// bits (f16_to_f32, as in cast.ptx: exact), with %r32..%r39 and %p10.
func quantF16(p *ptxText) {
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
	quantF16(p)
	p.op("bra", "%s", done)
	p.label(bf, "")
	p.op("shl.b32", "%%r22, %%r22, 16")
	p.op("bra", "%s", done)
	p.label(w32, "")
	p.op("ld.global.u32", "%%r22, [%%rd13]")
	p.label(done, "")
}
