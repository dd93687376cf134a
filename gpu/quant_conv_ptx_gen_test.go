package gpu

import "fmt"

// quantConvHeader opens quant.ptx's comment: the kernel, and the CUDA C
// of its vector path.
const quantConvHeader = `
quant.ptx: the FP8 block quantization kernel of Quantizer. One thread
block of 256 threads per 128x128 block of a [rows, cols] weight of F32,
BF16 or F16: the block's amax, its scale, then the float8_e4m3fn codes of
the block's elements that lie in [first, end) (flat, row-major indices),
reproducing package quant bit for bit (and torch's
(W.float() / s).to(float8_e4m3fn)). A full block of BF16 or F16 whose
rows start 16-byte aligned takes a vector path (quantFastConv): each
thread loads 64 elements with eight 16-byte loads; the amax comes from
registers (the 15 magnitude bits, two at a time with max.u16x2); the
quotients x / s come from y = 1/s, rounded once per block, and
Markstein's correction (q0 = x*y, r = x - q0*s exact by fma, q = q0 +
r*y), which is the correctly rounded x / s for every BF16 and F16
mantissa against every float32 scale (TestQuantConvDivision checks all
of them, exhaustively with -quant-exhaustive) where r is exact: for
scales from 2^-90 on, every quotient that can round to a code other than
zero; a block of smaller scale takes the scalar path. Two quotients
become two codes in one cvt.rn.satfinite.e4m3x2.f32, whose saturation
never acts (|x / s| <= 448 * (1 + 2^-23), which rounds to 448 either
way); the signs are ORed in from the elements (so that -0 gives 0x80);
codes are stored 8 bytes at a time where the whole block lies in
[first, end) and dst - first is 8-byte aligned, else byte by byte:

  // v: 2 elements (BF16 or F16 bits), the lower first; m: the block's
  // amax, s = quant.ScaleOf(m), NaN when m is a NaN or an infinity
  float y = __frcp_rn(__uint_as_float(s));
  float x = widen(v & 0xFFFF), q0 = x * y;                  // and the upper
  float q = __fmaf_rn(__fmaf_rn(q0, -s, x), y, q0);        // x / s
  unsigned short c = cvt_rn_satfinite_e4m3x2(q_upper, q);  // upper byte: q_upper
  unsigned word = (c2 << 16 | c) | (prmt(v, v2, 0x7531) & 0x80808080);
  if (s is NaN) word = 0x7F7F7F7F;

Every other block takes the scalar path, this CUDA C:
`

// quantFastConv writes the converter's vector path of one 2-byte dtype
// (tag BF: BF16, FH: F16): the loads, the chunks and the stores of
// quantFast, the amax two halves at a time, the quotients by Markstein's
// correction from a reciprocal rounded once, the codes by the converter,
// two at a time, with the elements' signs ORed in. A block whose scale
// lies below 2^-90 (its amax below 448 * 2^-90, all of whose quotients'
// remainders r might not be exact) branches to the scalar path after a
// barrier: that path's reduction writes the shared memory this one read.
// Registers: %r50, %r51 a chunk's two words of codes, %r52 their signs,
// %r53 a code to store alone, %r54 = y, %r55 = -s, %r56 and %r57 the two
// elements of a register (then their quotients), %r58 q0, %r59 r.
func quantFastConv(p *ptxText, tag string) {
	L := func(n string) string { return n + tag }
	quantFastLoad(p, tag)
	p.comment("%r20 = the largest magnitude of the 64 elements, both halves at once")
	p.op("mov.b32", "%%r20, 0")
	for v := range 32 {
		p.op("and.b32", "%%r23, %%v%d, 0x7FFF7FFF", v)
		p.op("max.u16x2", "%%r20, %%r20, %%r23")
	}
	p.op("and.b32", "%%r23, %%r20, 0xFFFF")
	p.op("shr.u32", "%%r20, %%r20, 16")
	p.op("max.u32", "%%r20, %%r20, %%r23")
	quantReduce(p, tag)
	quantWidenAmax(p, tag)
	quantScale(p, L("FTINY"))
	p.label(L("FTINY"), "a scale below 2^-90: the scalar path, after a barrier")
	p.op("setp.lt.u32", "%%p14, %%r27, 0x12800000")
	p.op("@!%p14 bra", "%s", L("FRCP"))
	p.op("bar.sync", "0")
	p.op("bra", "SCALAR")
	p.label(L("FRCP"), "%r54 = y = 1/s rounded to nearest, %r55 = -s")
	p.op("mov.b32", "%%r28, 0x3F800000")
	p.op("div.rn.f32", "%%r54, %%r28, %%r27")
	p.op("xor.b32", "%%r55, %%r27, 0x80000000")
	quantFastRange(p)
	for i := range 8 {
		for w := range 2 {
			for j := range 2 {
				v := fmt.Sprintf("%%v%d", 4*i+2*w+j)
				if tag == "BF" {
					p.op("shl.b32", "%%r56, %s, 16", v)
					p.op("and.b32", "%%r57, %s, 0xFFFF0000", v)
				} else {
					p.op("mov.b32", "{%%h0, %%h1}, %s", v)
					p.op("cvt.f32.f16", "%%r56, %%h0")
					p.op("cvt.f32.f16", "%%r57, %%h1")
				}
				for _, x := range []string{"%r56", "%r57"} {
					p.op("mul.rn.f32", "%%r58, %s, %%r54", x)
					p.op("fma.rn.f32", "%%r59, %%r58, %%r55, %s", x)
					p.op("fma.rn.f32", "%s, %%r59, %%r54, %%r58", x)
				}
				p.op("cvt.rn.satfinite.e4m3x2.f32", "%%h%d, %%r57, %%r56", 2+j)
			}
			word := fmt.Sprintf("%%r%d", 50+w)
			p.op("mov.b32", "%s, {%%h2, %%h3}", word)
			p.op("prmt.b32", "%%r52, %%v%d, %%v%d, 0x7531", 4*i+2*w, 4*i+2*w+1)
			p.op("and.b32", "%%r52, %%r52, 0x80808080")
			p.op("or.b32", "%s, %s, %%r52", word, word)
			if i == 0 && w == 0 {
				p.comment("a NaN or Inf block: every code 0x7F")
			}
			p.op("@%p8 mov.b32", "%s, 0x7F7F7F7F", word)
		}
		bytes, next := fmt.Sprintf("%s%d", L("BYTES"), i), fmt.Sprintf("%s%d", L("CHUNK"), i)
		p.op("@!%p12 bra", "%s", bytes)
		p.op("st.global.v2.u32", "[%%rd28], {%%r50, %%r51}")
		p.op("bra", "%s", next)
		p.label(bytes, "each code in [first, end) alone")
		for j := range 8 {
			skip := fmt.Sprintf("%s%d_%d", L("SKIP"), i, j)
			p.op("add.u64", "%%rd29, %%rd20, %d", j)
			p.op("setp.lt.u64", "%%p13, %%rd29, %%rd4")
			p.op("@%p13 bra", "%s", skip)
			p.op("setp.ge.u64", "%%p13, %%rd29, %%rd5")
			p.op("@%p13 bra", "%s", skip)
			p.op("shr.u32", "%%r53, %%r%d, %d", 50+j/4, 8*(j%4))
			p.op("st.global.u8", "[%%rd28+%d], %%r53", j)
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
