package gpu

import "fmt"

// The generator of poly.ptx (see ptx_gen_test.go): Poly1305's arithmetic
// modulo 2^130 - 5 in five 26-bit limbs, the multiplies unrolled, the
// steps of mac.Limbs.mul in their order.

const polyC = `
poly.ptx: the kernel of PolyMACer, loaded at run time with
cuModuleLoadDataEx (the driver compiles it for the GPU it runs on). It
computes a launch's share of Poly1305's polynomial, Σ c_i·r^(q-i) over
the message's blocks c_i (16 bytes, little-endian, plus 2^128; the last
block 1 to 15 bytes, then a byte 1, no 2^128), modulo p = 2^130 - 5, as
limb sums that the host finishes with mac.PolyKey.Finish. It is this
CUDA C, with mul() the product modulo p of five 26-bit limbs by five
(mac.Limbs.mul: 25 mad.wide.u32 and one pass of carries):

  // The launch covers blocks blk .. blk + nb of a message of q blocks, the
  // n bytes at buf (n a multiple of 16 unless the launch ends the
  // message). Thread g takes blocks g, g + s, g + 2s, ... (s the grid's
  // threads), by Horner's rule with rs = r^s: h = h·rs + c, each block
  // loaded two products ahead (into a and b in turns). Its last block
  // i then needs r^(q - blk - i), 1 to s, which it takes from pow (r^(2^j)
  // at pow[8j], fully reduced), one product per bit. It adds its limbs
  // into the partials of its lane, slots[5·(g % 32) + j]. No byte at or
  // past n is read.
  extern "C" __global__ void wc_poly(const unsigned char *buf, unsigned long long n,
      unsigned long long blk, unsigned long long q, unsigned long long rs01,
      unsigned long long rs23, unsigned long long rs4, const unsigned int *pow,
      unsigned long long *slots, unsigned int first) {
    unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long s = (unsigned long long)gridDim.x * blockDim.x, nb = (n + 15) / 16;
    if (g < nb) {
      unsigned int rs[5] = {lo(rs01), hi(rs01), lo(rs23), hi(rs23), lo(rs4)}, h[5] = {0}, a[5], b[5];
      unsigned long long i = g;
      block(buf, n, i, a);                  // the limbs of block i
      if (i + s < nb) block(buf, n, i + s, b);
      for (;;) {                            // two turns, a then b
        h += a; if ((i += s) >= nb) break; if (i + s < nb) block(buf, n, i + s, a); mul(h, rs);
        h += b; if ((i += s) >= nb) break; if (i + s < nb) block(buf, n, i + s, b); mul(h, rs);
      }
      i -= s;
      for (unsigned long long e = q - blk - i, j = 0; e != 0; e >>= 1, j++)
        if (e & 1) mul(h, pow + 8 * j);
      for (int j = 0; j < 5; j++) atomicAdd(&slots[5 * (g % 32) + j], h[j]);  // red.global.add.u64
    }
    sum_finish(slots, first);
  }

  // block reads block i: one 16-byte load when whole and aligned, else
  // byte by byte below n, a byte 1 after a partial block's bytes.
`

// polyMask is a 26-bit limb's mask.
const polyMask = 1<<26 - 1

// polyRegisters declares the kernels' registers, rd of .b64 %rd.
func (p *ptxText) polyRegisters(rd int) {
	p.line("\t.reg .pred\t%%p<8>;")
	p.line("\t.reg .b32\t%%r<16>;")
	for _, r := range []string{"h", "c", "x", "t", "R", "S"} {
		p.line("\t.reg .b32\t%%%s<5>;", r)
	}
	p.line("\t.reg .b32\t%%m<4>;")
	p.line("\t.reg .b32\t%%n<4>;")
	p.line("\t.reg .b64\t%%d<5>;")
	p.line("\t.reg .b64\t%%rd<%d>;", rd)
}

// polyStart loads rs (the parameters rs01, rs23, rs4 of entry e) into
// %R0..%R4, five times it into %S1..%S4, and sets h = 0.
func (p *ptxText) polyStart(e string) {
	p.comment("%R0..%R4 = rs, %S1..%S4 = 5·rs; h = 0")
	for i, name := range []string{"rs01", "rs23", "rs4"} {
		p.op("ld.param.u64", "%%rd9, [%s_%s]", e, name)
		p.op("cvt.u32.u64", "%%R%d, %%rd9", 2*i)
		if i < 2 {
			p.op("shr.u64", "%%rd9, %%rd9, 32")
			p.op("cvt.u32.u64", "%%R%d, %%rd9", 2*i+1)
		}
	}
	for k := 1; k < 5; k++ {
		p.op("mul.lo.u32", "%%S%d, %%R%d, 5", k, k)
	}
	for k := range 5 {
		p.op("mov.b32", "%%h%d, 0", k)
	}
}

// polySet names the registers of one block in flight: idx its block
// index, w the prefix of its words (w0..w3), hb its 2^128 bit.
type polySet struct{ idx, w, hb string }

// The two sets of polyHorner: the block the thread adds next (A, at i)
// and the one after it (B, at i + s), so that two loads are in flight
// while a product runs.
var (
	polySetA = polySet{idx: "%rd6", w: "m", hb: "%r10"}
	polySetB = polySet{idx: "%rd12", w: "n", hb: "%r8"}
)

// polyHorner writes the thread's loop over its blocks %rd6, %rd6 + s, ...
// below %rd5 (s in %rd2), the first loaded into set A: it loads the
// second into set B, then, in turns of the two sets: h += the set's
// block; if ((i += s) >= %rd5) go to RAISE; load block i + s into the set
// just added, where it is below %rd5; h = h·rs. Each block is loaded two
// products before it is added. load writes one block's load at a site
// (its labels' suffix).
func (p *ptxText) polyHorner(load func(site string, set polySet)) {
	// next loads block i + s (%rd12 = i + s) into set, unless it is past
	// the end.
	next := func(site string, set polySet) {
		p.op("add.u64", "%%rd12, %%rd6, %%rd2")
		p.op("setp.ge.u64", "%%p2, %%rd12, %%rd5")
		p.op("@%p2 bra", "SKIP%s", site)
		load(site, polySet{idx: "%rd12", w: set.w, hb: set.hb})
		p.label("SKIP"+site, "")
	}
	next("B0", polySetB)
	p.label("HORNER", "two turns: h += c; if ((i += s) >= end) break; load block i + s; h = h·rs")
	for k, set := range []polySet{polySetA, polySetB} {
		p.polyAddBlock(set)
		p.op("add.u64", "%%rd6, %%rd6, %%rd2")
		p.op("setp.ge.u64", "%%p1, %%rd6, %%rd5")
		p.op("@%p1 bra", "RAISE")
		next(fmt.Sprintf("%s%d", set.w, k), set)
		p.polyMul("R", "S")
	}
	p.op("bra.uni", "HORNER")
}

// polyMul writes h = h·x modulo 2^130 - 5, carried (mac.Limbs.mul): x in
// the registers %<x>0..4, five times them in %<t>1..4.
func (p *ptxText) polyMul(x, t string) {
	p.comment(fmt.Sprintf("h = h·%s mod 2^130 - 5 (%s = 5·%s), then one pass of carries", x, t, x))
	for k := range 5 {
		for i := range 5 {
			j := k - i
			y := fmt.Sprintf("%%%s%d", x, j)
			if j < 0 {
				y = fmt.Sprintf("%%%s%d", t, j+5)
			}
			if i == 0 {
				p.op("mul.wide.u32", "%%d%d, %%h%d, %s", k, i, y)
			} else {
				p.op("mad.wide.u32", "%%d%d, %%h%d, %s, %%d%d", k, i, y, k)
			}
		}
	}
	for k := range 4 {
		p.op("shr.u64", "%%rd9, %%d%d, 26", k)
		p.op("add.u64", "%%d%d, %%d%d, %%rd9", k+1, k+1)
		p.op("cvt.u32.u64", "%%h%d, %%d%d", k, k)
		p.op("and.b32", "%%h%d, %%h%d, %d", k, k, polyMask)
	}
	p.op("cvt.u32.u64", "%%h4, %%d4")
	p.op("and.b32", "%%h4, %%h4, %d", polyMask)
	p.comment("limb 0 takes five times the carry out of limb 4, limb 1 what that carries")
	p.op("shr.u64", "%%rd9, %%d4, 26")
	p.op("mul.lo.u64", "%%rd9, %%rd9, 5")
	p.op("cvt.u64.u32", "%%rd15, %%h0")
	p.op("add.u64", "%%rd9, %%rd9, %%rd15")
	p.op("cvt.u32.u64", "%%h0, %%rd9")
	p.op("and.b32", "%%h0, %%h0, %d", polyMask)
	p.op("shr.u64", "%%rd9, %%rd9, 26")
	p.op("cvt.u32.u64", "%%r9, %%rd9")
	p.op("add.u32", "%%h1, %%h1, %%r9")
}

// polyLoad writes block(buf, n, i, c) for block set.idx of the launch:
// its words into set.w (w0..w3) and its 2^128 bit (1 << 24 of limb 4)
// into set.hb. %rd3 is buf, %rd4 n, %p6 set when buf is not 16-byte
// aligned; site names the labels.
func (p *ptxText) polyLoad(site string, set polySet) {
	w := set.w
	p.comment(fmt.Sprintf("block %s: %%rd7 = its address, %%rd8 = the bytes from it to n (at least 1)", set.idx))
	p.op("shl.b64", "%%rd7, %s, 4", set.idx)
	p.op("sub.u64", "%%rd8, %%rd4, %%rd7")
	p.op("add.s64", "%%rd7, %%rd3, %%rd7")
	p.op("mov.b32", "%s, %d", set.hb, 1<<24)
	p.op("setp.lt.u64", "%%p3, %%rd8, 16")
	p.op("@%p3 bra", "PARTIAL%s", site)
	p.op("@%p6 bra", "PARTIAL%s", site)
	p.op("ld.global.v4.u32", "{%%%s0, %%%s1, %%%s2, %%%s3}, [%%rd7]", w, w, w, w)
	p.op("bra.uni", "LOADED%s", site)
	p.label("PARTIAL"+site, "%r11 = its bytes (at most 16)")
	p.op("min.u64", "%%rd9, %%rd8, 16")
	p.op("cvt.u32.u64", "%%r11, %%rd9")
	p.polyPad(set)
	for j := range 16 {
		p.op("setp.le.u64", "%%p5, %%rd8, %d", j)
		p.op("@%p5 bra", "LOADED%s", site)
		p.op("ld.global.u8", "%%r15, [%%rd7+%d]", j)
		if j%4 != 0 {
			p.op("shl.b32", "%%r15, %%r15, %d", 8*(j%4))
		}
		p.op("or.b32", "%%%s%d, %%%s%d, %%r15", w, j/4, w, j/4)
	}
	p.label("LOADED"+site, "")
}

// polyPad starts a block of %r11 message bytes (1 to 16) in set: its
// words zero but for the byte 1 after a partial block's bytes (in word
// %r11/4), its 2^128 bit set only when the block is whole.
func (p *ptxText) polyPad(set polySet) {
	p.comment("the 2^128 bit when whole; the words = a byte 1 at byte %r11 when partial")
	p.op("setp.lt.u32", "%%p4, %%r11, 16")
	p.op("selp.b32", "%s, 0, %d, %%p4", set.hb, 1<<24)
	p.op("and.b32", "%%r12, %%r11, 3")
	p.op("shl.b32", "%%r12, %%r12, 3")
	p.op("mov.b32", "%%r13, 1")
	p.op("shl.b32", "%%r13, %%r13, %%r12")
	p.op("shr.u32", "%%r14, %%r11, 2")
	for k := range 4 {
		p.op("setp.eq.u32", "%%p5, %%r14, %d", k)
		p.op("selp.b32", "%%%s%d, %%r13, 0, %%p5", set.w, k)
	}
}

// polyAddBlock writes h += c: the words of set cut into 26-bit limbs,
// its 2^128 bit into limb 4.
func (p *ptxText) polyAddBlock(set polySet) {
	w := set.w
	p.comment(fmt.Sprintf("h += the limbs of the block in %%%s0..%%%s3 (mac.limbsOf)", w, w))
	p.op("and.b32", "%%c0, %%%s0, %d", w, polyMask)
	for k, sh := range []int{26, 20, 14} {
		p.op("shf.r.wrap.b32", "%%c%d, %%%s%d, %%%s%d, %d", k+1, w, k, w, k+1, sh)
		p.op("and.b32", "%%c%d, %%c%d, %d", k+1, k+1, polyMask)
	}
	p.op("shr.u32", "%%c4, %%%s3, 8", w)
	p.op("or.b32", "%%c4, %%c4, %s", set.hb)
	for k := range 5 {
		p.op("add.u32", "%%h%d, %%h%d, %%c%d", k, k, k)
	}
}

func genPoly() string {
	const e = "wc_poly"
	var p ptxText
	p.header("poly_ptx_gen_test.go", polyC+sumFinishC)
	p.params(e, "u64 buf", "u64 n", "u64 blk", "u64 q", "u64 rs01", "u64 rs23", "u64 rs4", "u64 pow", "u64 slots", "u32 first")
	p.line("{")
	p.polyRegisters(16)
	p.sumFinishDecls(e)
	p.line("")
	p.globalThread()
	p.comment("%rd2 = s, the grid's threads; %rd3 = buf, %rd4 = n, %rd5 = nb")
	p.op("mov.u32", "%%r4, %%nctaid.x")
	p.op("mul.wide.u32", "%%rd2, %%r4, %%r2")
	p.op("ld.param.u64", "%%rd3, [%s_buf]", e)
	p.op("cvta.to.global.u64", "%%rd3, %%rd3")
	p.op("ld.param.u64", "%%rd4, [%s_n]", e)
	p.op("add.u64", "%%rd5, %%rd4, 15")
	p.op("shr.u64", "%%rd5, %%rd5, 4")
	p.op("setp.ge.u64", "%%p1, %%rd1, %%rd5")
	p.op("@%p1 bra", "SUMEND")
	p.polyStart(e)
	p.comment("%p6 = buf is not 16-byte aligned; i = g")
	p.op("and.b64", "%%rd9, %%rd3, 15")
	p.op("setp.ne.u64", "%%p6, %%rd9, 0")
	p.op("mov.u64", "%%rd6, %%rd1")
	p.polyLoad("A", polySetA)
	p.polyHorner(p.polyLoad)
	p.label("RAISE", "%rd10 = blk, %rd11 = q")
	p.op("ld.param.u64", "%%rd10, [%s_blk]", e)
	p.op("ld.param.u64", "%%rd11, [%s_q]", e)
	p.polyRaise(e)
	p.sumFinish(e)
	p.line("}")
	return p.b.String()
}

// polyRaise writes the end of a thread's work, from HORNER's exit with
// %rd6 = its last block + s: h raised by r^e, e = q - blk - its last
// block (%rd11 = q, %rd10 = blk), from the table at the parameter pow,
// then its limbs added into its lane's partials at the parameter slots.
// Then SUMEND (sumFinish) follows.
func (p *ptxText) polyRaise(e string) {
	p.comment("%rd12 = e = q - blk - i for the last block i; %rd13 = pow")
	p.op("sub.u64", "%%rd6, %%rd6, %%rd2")
	p.op("add.u64", "%%rd9, %%rd10, %%rd6")
	p.op("sub.u64", "%%rd12, %%rd11, %%rd9")
	p.op("ld.param.u64", "%%rd13, [%s_pow]", e)
	p.op("cvta.to.global.u64", "%%rd13, %%rd13")
	p.label("POWER", "for (j = 0; e != 0; e >>= 1, j++) if (e & 1) h = h·pow[j]")
	p.op("setp.eq.u64", "%%p1, %%rd12, 0")
	p.op("@%p1 bra", "ADD")
	p.op("and.b64", "%%rd9, %%rd12, 1")
	p.op("setp.eq.u64", "%%p2, %%rd9, 0")
	p.op("@%p2 bra", "NEXTPOW")
	p.op("ld.global.v4.u32", "{%%x0, %%x1, %%x2, %%x3}, [%%rd13]")
	p.op("ld.global.u32", "%%x4, [%%rd13+16]")
	for k := 1; k < 5; k++ {
		p.op("mul.lo.u32", "%%t%d, %%x%d, 5", k, k)
	}
	p.polyMul("x", "t")
	p.label("NEXTPOW", "")
	p.op("shr.u64", "%%rd12, %%rd12, 1")
	p.op("add.s64", "%%rd13, %%rd13, 32")
	p.op("bra.uni", "POWER")
	p.label("ADD", "the limbs into the lane's partials, slots + 40·(g % 32)")
	p.op("ld.param.u64", "%%rd14, [%s_slots]", e)
	p.op("cvta.to.global.u64", "%%rd14, %%rd14")
	p.op("and.b64", "%%rd9, %%rd1, 31")
	p.op("mul.lo.u64", "%%rd9, %%rd9, 40")
	p.op("add.s64", "%%rd14, %%rd14, %%rd9")
	for k := range 5 {
		p.op("cvt.u64.u32", "%%rd15, %%h%d", k)
		p.op("red.global.add.u64", "[%%rd14+%d], %%rd15", 8*k)
	}
}

const polyLayoutC = `
poly_layout.ptx: the layout kernel of PolyMACer (Gather.CopyPolyLayout),
loaded at run time with cuModuleLoadDataEx (the driver compiles it for
the GPU it runs on). It is poly.ptx over a layout: the message is the n
bytes of a bucket whose entries are the pieces (at, src, dst, len: count
of them, in the order of at, each at a multiple of 1024) and whose
padding is zero, read where the pieces lie; a piece with a destination
is copied there on the way. The launch covers the message's 1 KiB chunks
c0 to c1, blocks 64·c0 to min(64·c1, q). It is this CUDA C, with mul() and
the end (the raise by r^e, the limbs into the lane's partials) poly.ptx's:

  extern "C" __global__ void wc_poly_layout(const ulonglong4 *pieces, unsigned long long count,
      unsigned long long c0, unsigned long long c1, unsigned long long n,
      unsigned long long rs01, unsigned long long rs23, unsigned long long rs4,
      const unsigned int *pow, unsigned long long *slots, unsigned int first) {
    unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long s = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long q = (n + 15) / 16, b1 = min(64 * c1, q), i = 64 * c0 + g;
    if (i < b1) {
      unsigned long long lo = 0;  // the pieces at or before the block: the block's is lo - 1
      // block(i): lo moves on when the next piece starts at or before 16i
      // (a binary search of those after it); the block's bytes of its piece,
      // valid = min(16, len - (16i - at)) where 16i - at < len, else none,
      // are read (one 16-byte load when whole and aligned, else a byte at a
      // time) and written to dst + 16i - at where the piece has a dst; the
      // rest of the block is zero, a byte 1 after the message's bytes in
      // its partial last block; the 2^128 bit is set unless it is that.
      ... poly.ptx's loop and end, with blk = 0 ...
    }
    sum_finish(slots, first);
  }
`

// polyLayoutLoad writes block(i) of the layout kernel for block set.idx:
// its words into set.w, its 2^128 bit into set.hb, its bytes of its piece
// copied to the piece's destination. %rd3 is pieces, %rd4 count, %rd10 n;
// %rd16 lo and %rd17..%rd20 the piece lo - 1 (at, src, dst, len) carry
// over from the thread's last block. site names the labels.
func (p *ptxText) polyLayoutLoad(site string, set polySet) {
	w := set.w
	p.comment("%rd21 = off = 16i; lo moves on when pieces[lo].at <= off")
	p.op("shl.b64", "%%rd21, %s, 4", set.idx)
	p.op("setp.ge.u64", "%%p3, %%rd16, %%rd4")
	p.op("@%p3 bra", "PLACED%s", site)
	p.op("shl.b64", "%%rd24, %%rd16, 5")
	p.op("add.s64", "%%rd24, %%rd3, %%rd24")
	p.op("ld.global.u64", "%%rd25, [%%rd24]")
	p.op("setp.gt.u64", "%%p3, %%rd25, %%rd21")
	p.op("@%p3 bra", "PLACED%s", site)
	p.comment("lo = the pieces at or before off: a binary search of (lo, count), %rd26 = hi")
	p.op("add.u64", "%%rd16, %%rd16, 1")
	p.op("mov.u64", "%%rd26, %%rd4")
	p.label("SEARCH"+site, "while lo < hi: %rd27 = mid")
	p.op("setp.ge.u64", "%%p3, %%rd16, %%rd26")
	p.op("@%p3 bra", "FOUND%s", site)
	p.op("add.u64", "%%rd27, %%rd16, %%rd26")
	p.op("shr.u64", "%%rd27, %%rd27, 1")
	p.op("shl.b64", "%%rd24, %%rd27, 5")
	p.op("add.s64", "%%rd24, %%rd3, %%rd24")
	p.op("ld.global.u64", "%%rd25, [%%rd24]")
	p.op("setp.le.u64", "%%p3, %%rd25, %%rd21")
	p.op("@%p3 add.u64", "%%rd16, %%rd27, 1")
	p.op("@!%p3 mov.u64", "%%rd26, %%rd27")
	p.op("bra.uni", "SEARCH%s", site)
	p.label("FOUND"+site, "%rd17..%rd20 = piece lo - 1: at, src, dst, len")
	p.op("sub.u64", "%%rd24, %%rd16, 1")
	p.op("shl.b64", "%%rd24, %%rd24, 5")
	p.op("add.s64", "%%rd24, %%rd3, %%rd24")
	p.op("ld.global.v2.u64", "{%%rd17, %%rd18}, [%%rd24]")
	p.op("ld.global.v2.u64", "{%%rd19, %%rd20}, [%%rd24+16]")
	p.label("PLACED"+site, "%r11 = the message's bytes in the block, min(n - off, 16)")
	p.op("sub.u64", "%%rd9, %%rd10, %%rd21")
	p.op("min.u64", "%%rd9, %%rd9, 16")
	p.op("cvt.u32.u64", "%%r11, %%rd9")
	p.comment("%rd22 = valid, the block's bytes of the piece; %rd23 = rel = off - at")
	p.op("mov.u64", "%%rd22, 0")
	p.op("setp.eq.u64", "%%p3, %%rd16, 0")
	p.op("@%p3 bra", "VALID%s", site)
	p.op("sub.u64", "%%rd23, %%rd21, %%rd17")
	p.op("setp.ge.u64", "%%p3, %%rd23, %%rd20")
	p.op("@%p3 bra", "VALID%s", site)
	p.op("sub.u64", "%%rd22, %%rd20, %%rd23")
	p.op("min.u64", "%%rd22, %%rd22, 16")
	p.label("VALID"+site, "a whole block of the piece at aligned addresses: one 16-byte load (and store)")
	p.op("setp.ne.u64", "%%p3, %%rd22, 16")
	p.op("@%p3 bra", "BYTES%s", site)
	p.op("add.s64", "%%rd7, %%rd18, %%rd23")
	p.op("add.s64", "%%rd15, %%rd19, %%rd23")
	p.op("setp.ne.u64", "%%p7, %%rd19, 0")
	p.op("and.b64", "%%rd9, %%rd7, 15")
	p.op("setp.ne.u64", "%%p3, %%rd9, 0")
	p.op("@%p3 bra", "BYTES%s", site)
	p.op("@!%p7 bra", "WHOLE%s", site)
	p.op("and.b64", "%%rd9, %%rd15, 15")
	p.op("setp.ne.u64", "%%p3, %%rd9, 0")
	p.op("@%p3 bra", "BYTES%s", site)
	p.label("WHOLE"+site, "")
	p.op("ld.global.v4.u32", "{%%%s0, %%%s1, %%%s2, %%%s3}, [%%rd7]", w, w, w, w)
	p.op("@%p7 st.global.v4.u32", "[%%rd15], {%%%s0, %%%s1, %%%s2, %%%s3}", w, w, w, w)
	p.op("mov.b32", "%s, %d", set.hb, 1<<24)
	p.op("bra.uni", "LOADED%s", site)
	p.label("BYTES"+site, "the valid bytes one at a time (copied where the piece has a dst), the rest zero")
	p.polyPad(set)
	p.op("setp.eq.u64", "%%p3, %%rd22, 0")
	p.op("@%p3 bra", "LOADED%s", site)
	p.op("add.s64", "%%rd7, %%rd18, %%rd23")
	p.op("add.s64", "%%rd15, %%rd19, %%rd23")
	p.op("setp.ne.u64", "%%p7, %%rd19, 0")
	for j := range 16 {
		p.op("setp.le.u64", "%%p5, %%rd22, %d", j)
		p.op("@%p5 bra", "LOADED%s", site)
		p.op("ld.global.u8", "%%r15, [%%rd7+%d]", j)
		p.op("@%p7 st.global.u8", "[%%rd15+%d], %%r15", j)
		if j%4 != 0 {
			p.op("shl.b32", "%%r15, %%r15, %d", 8*(j%4))
		}
		p.op("or.b32", "%%%s%d, %%%s%d, %%r15", w, j/4, w, j/4)
	}
	p.label("LOADED"+site, "")
}

func genPolyLayout() string {
	const e = "wc_poly_layout"
	var p ptxText
	p.header("poly_ptx_gen_test.go", polyLayoutC+sumFinishC)
	p.params(e, "u64 pieces", "u64 count", "u64 c0", "u64 c1", "u64 n", "u64 rs01", "u64 rs23", "u64 rs4", "u64 pow", "u64 slots", "u32 first")
	p.line("{")
	p.polyRegisters(28)
	p.sumFinishDecls(e)
	p.line("")
	p.globalThread()
	p.comment("%rd2 = s; %rd3 = pieces, %rd4 = count, %rd10 = n, %rd11 = q, %rd5 = b1, %rd6 = i = 64·c0 + g")
	p.op("mov.u32", "%%r4, %%nctaid.x")
	p.op("mul.wide.u32", "%%rd2, %%r4, %%r2")
	p.op("ld.param.u64", "%%rd3, [%s_pieces]", e)
	p.op("cvta.to.global.u64", "%%rd3, %%rd3")
	p.op("ld.param.u64", "%%rd4, [%s_count]", e)
	p.op("ld.param.u64", "%%rd10, [%s_n]", e)
	p.op("add.u64", "%%rd11, %%rd10, 15")
	p.op("shr.u64", "%%rd11, %%rd11, 4")
	p.op("ld.param.u64", "%%rd5, [%s_c1]", e)
	p.op("shl.b64", "%%rd5, %%rd5, 6")
	p.op("min.u64", "%%rd5, %%rd5, %%rd11")
	p.op("ld.param.u64", "%%rd6, [%s_c0]", e)
	p.op("shl.b64", "%%rd6, %%rd6, 6")
	p.op("add.u64", "%%rd6, %%rd6, %%rd1")
	p.op("setp.ge.u64", "%%p1, %%rd6, %%rd5")
	p.op("@%p1 bra", "SUMEND")
	p.polyStart(e)
	p.comment("lo = 0: no piece placed yet")
	p.op("mov.u64", "%%rd16, 0")
	p.polyLayoutLoad("A", polySetA)
	p.polyHorner(p.polyLayoutLoad)
	p.label("RAISE", "blk = 0: the blocks are the message's")
	p.op("mov.u64", "%%rd10, 0")
	p.polyRaise(e)
	p.sumFinish(e)
	p.line("}")
	return p.b.String()
}
