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
  // threads), by Horner's rule with rs = r^s: h = h·rs + c. Its last block
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
      unsigned int rs[5] = {lo(rs01), hi(rs01), lo(rs23), hi(rs23), lo(rs4)}, h[5] = {0}, c[5];
      unsigned long long i = g;
      block(buf, n, i, c);                  // the limbs of block i, the next one loaded
      for (;;) {                            // before the product that precedes it
        for (int j = 0; j < 5; j++) h[j] += c[j];
        if ((i += s) >= nb) break;
        block(buf, n, i, c);
        mul(h, rs);
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

// polyRegisters declares the kernel's registers.
func (p *ptxText) polyRegisters() {
	p.line("\t.reg .pred\t%%p<8>;")
	p.line("\t.reg .b32\t%%r<16>;")
	p.line("\t.reg .b32\t%%h<5>;")
	p.line("\t.reg .b32\t%%c<5>;")
	p.line("\t.reg .b32\t%%m<4>;")
	p.line("\t.reg .b32\t%%x<5>;")
	p.line("\t.reg .b32\t%%t<5>;")
	p.line("\t.reg .b32\t%%R<5>;")
	p.line("\t.reg .b32\t%%S<5>;")
	p.line("\t.reg .b64\t%%d<5>;")
	p.line("\t.reg .b64\t%%rd<16>;")
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

// polyLoad writes block(buf, n, i, c) for block %rd6 of the launch: its
// words into %m0..%m3 and its 2^128 bit (1 << 24 of limb 4) into %r10.
// %rd3 is buf, %rd4 n, %p6 set when buf is not 16-byte aligned; site
// names the labels.
func (p *ptxText) polyLoad(site string) {
	p.comment("block %rd6: %rd7 = its address, %rd8 = the bytes from it to n (at least 1)")
	p.op("shl.b64", "%%rd7, %%rd6, 4")
	p.op("sub.u64", "%%rd8, %%rd4, %%rd7")
	p.op("add.s64", "%%rd7, %%rd3, %%rd7")
	p.op("mov.b32", "%%r10, %d", 1<<24)
	p.op("setp.lt.u64", "%%p3, %%rd8, 16")
	p.op("@%p3 bra", "PARTIAL%s", site)
	p.op("@%p6 bra", "PARTIAL%s", site)
	p.op("ld.global.v4.u32", "{%%m0, %%m1, %%m2, %%m3}, [%%rd7]")
	p.op("bra.uni", "LOADED%s", site)
	p.label("PARTIAL"+site, "%r11 = its bytes (at most 16); a byte 1 after them, in word %r11/4, when fewer")
	p.op("min.u64", "%%rd9, %%rd8, 16")
	p.op("cvt.u32.u64", "%%r11, %%rd9")
	p.op("setp.lt.u32", "%%p4, %%r11, 16")
	p.op("selp.b32", "%%r10, 0, %d, %%p4", 1<<24)
	p.op("and.b32", "%%r12, %%r11, 3")
	p.op("shl.b32", "%%r12, %%r12, 3")
	p.op("mov.b32", "%%r13, 1")
	p.op("shl.b32", "%%r13, %%r13, %%r12")
	p.op("shr.u32", "%%r14, %%r11, 2")
	for k := range 4 {
		p.op("setp.eq.u32", "%%p5, %%r14, %d", k)
		p.op("selp.b32", "%%m%d, %%r13, 0, %%p5", k)
	}
	for j := range 16 {
		p.op("setp.le.u64", "%%p5, %%rd8, %d", j)
		p.op("@%p5 bra", "LOADED%s", site)
		p.op("ld.global.u8", "%%r15, [%%rd7+%d]", j)
		if j%4 != 0 {
			p.op("shl.b32", "%%r15, %%r15, %d", 8*(j%4))
		}
		p.op("or.b32", "%%m%d, %%m%d, %%r15", j/4, j/4)
	}
	p.label("LOADED"+site, "")
}

// polyAddBlock writes h += c: the block's words %m0..%m3 cut into 26-bit
// limbs, the 2^128 bit %r10 into limb 4.
func (p *ptxText) polyAddBlock() {
	p.comment("h += the block's limbs (mac.limbsOf)")
	p.op("and.b32", "%%c0, %%m0, %d", polyMask)
	for k, sh := range []int{26, 20, 14} {
		p.op("shf.r.wrap.b32", "%%c%d, %%m%d, %%m%d, %d", k+1, k, k+1, sh)
		p.op("and.b32", "%%c%d, %%c%d, %d", k+1, k+1, polyMask)
	}
	p.op("shr.u32", "%%c4, %%m3, 8")
	p.op("or.b32", "%%c4, %%c4, %%r10")
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
	p.polyRegisters()
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
	p.comment("%R0..%R4 = rs, %S1..%S4 = 5·rs; %p6 = buf is not 16-byte aligned")
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
	p.op("and.b64", "%%rd9, %%rd3, 15")
	p.op("setp.ne.u64", "%%p6, %%rd9, 0")
	p.comment("h = 0, i = g")
	for k := range 5 {
		p.op("mov.b32", "%%h%d, 0", k)
	}
	p.op("mov.u64", "%%rd6, %%rd1")
	p.polyLoad("A")
	p.label("HORNER", "h += c; if ((i += s) >= nb) break; load block i; h = h·rs")
	p.polyAddBlock()
	p.op("add.u64", "%%rd6, %%rd6, %%rd2")
	p.op("setp.ge.u64", "%%p1, %%rd6, %%rd5")
	p.op("@%p1 bra", "RAISE")
	p.polyLoad("B")
	p.polyMul("R", "S")
	p.op("bra.uni", "HORNER")
	p.label("RAISE", "%rd12 = e = q - blk - i for the last block i; %rd13 = pow")
	p.op("sub.u64", "%%rd6, %%rd6, %%rd2")
	p.op("ld.param.u64", "%%rd10, [%s_blk]", e)
	p.op("ld.param.u64", "%%rd11, [%s_q]", e)
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
	p.sumFinish(e)
	p.line("}")
	return p.b.String()
}
