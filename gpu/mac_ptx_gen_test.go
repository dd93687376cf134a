package gpu

import (
	"fmt"
)

// The generators of the MAC kernels, mac_chunks.ptx and mac_parents.ptx
// (see ptx_gen_test.go): BLAKE3's compression unrolled, 7 rounds of 8 G
// functions with the message words permuted by register naming, some 800
// lines per kernel.

// The BLAKE3 constants: the IV (SHA-256's), the message permutation
// applied between rounds, and the domain flags.
var (
	blake3IV   = [8]uint32{0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19}
	blake3Perm = [16]int{2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8}
)

const (
	flagChunkStart = 1
	flagChunkEnd   = 2
	flagParent     = 4
	flagRoot       = 8
	flagKeyed      = 16
)

// loadKey loads the key, four .u64 parameters holding two words each
// (the low word first), into %k0..%k7.
func (p *ptxText) loadKey(entry string) {
	p.comment("%k0..%k7 = the key, two words per parameter, low word first")
	for i := range 4 {
		p.op("ld.param.u64", "%%rd20, [%s_key%d%d]", entry, 2*i, 2*i+1)
		p.op("cvt.u32.u64", "%%k%d, %%rd20", 2*i)
		p.op("shr.u64", "%%rd20, %%rd20, 32")
		p.op("cvt.u32.u64", "%%k%d, %%rd20", 2*i+1)
	}
}

// compress writes BLAKE3's compression of the message %m0..%m15 into the
// state %v0..%v15 (set up by the caller: chaining value, IV, counter,
// block length, flags), then the output chaining value into %v0..%v7:
// v[i] ^= v[i+8].
func (p *ptxText) compress() {
	s := [16]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}
	g := func(a, b, c, d, x, y int) {
		p.op("add.u32", "%%v%d, %%v%d, %%v%d", a, a, b)
		p.op("add.u32", "%%v%d, %%v%d, %%m%d", a, a, x)
		p.op("xor.b32", "%%v%d, %%v%d, %%v%d", d, d, a)
		p.op("prmt.b32", "%%v%d, %%v%d, %%v%d, 0x1032", d, d, d) // rotate right 16
		p.op("add.u32", "%%v%d, %%v%d, %%v%d", c, c, d)
		p.op("xor.b32", "%%v%d, %%v%d, %%v%d", b, b, c)
		p.op("shf.r.wrap.b32", "%%v%d, %%v%d, %%v%d, 12", b, b, b)
		p.op("add.u32", "%%v%d, %%v%d, %%v%d", a, a, b)
		p.op("add.u32", "%%v%d, %%v%d, %%m%d", a, a, y)
		p.op("xor.b32", "%%v%d, %%v%d, %%v%d", d, d, a)
		p.op("prmt.b32", "%%v%d, %%v%d, %%v%d, 0x0321", d, d, d) // rotate right 8
		p.op("add.u32", "%%v%d, %%v%d, %%v%d", c, c, d)
		p.op("xor.b32", "%%v%d, %%v%d, %%v%d", b, b, c)
		p.op("shf.r.wrap.b32", "%%v%d, %%v%d, %%v%d, 7", b, b, b)
	}
	for r := range 7 {
		p.comment(fmt.Sprintf("round %d: columns, then diagonals", r+1))
		g(0, 4, 8, 12, s[0], s[1])
		g(1, 5, 9, 13, s[2], s[3])
		g(2, 6, 10, 14, s[4], s[5])
		g(3, 7, 11, 15, s[6], s[7])
		g(0, 5, 10, 15, s[8], s[9])
		g(1, 6, 11, 12, s[10], s[11])
		g(2, 7, 8, 13, s[12], s[13])
		g(3, 4, 9, 14, s[14], s[15])
		var next [16]int
		for i := range next {
			next[i] = s[blake3Perm[i]]
		}
		s = next
	}
	p.comment("the output chaining value: v[i] ^ v[i+8]")
	for i := range 8 {
		p.op("xor.b32", "%%v%d, %%v%d, %%v%d", i, i, i+8)
	}
}

// state writes the compression's starting state: %v0..%v7 from the
// registers cv0..cv7 (prefix cv), the IV, then t0, t1, the block length
// and the flags (registers or immediates).
func (p *ptxText) state(cv, t0, t1, blen, flags string) {
	for i := range 8 {
		p.op("mov.b32", "%%v%d, %s%d", i, cv, i)
	}
	for i := range 4 {
		p.op("mov.b32", "%%v%d, 0x%08X", 8+i, blake3IV[i])
	}
	p.op("mov.b32", "%%v12, %s", t0)
	p.op("mov.b32", "%%v13, %s", t1)
	p.op("mov.b32", "%%v14, %s", blen)
	p.op("mov.b32", "%%v15, %s", flags)
}

// macRegisters declares what both MAC kernels use.
func (p *ptxText) macRegisters() {
	p.line("\t.reg .pred\t%%p<8>;")
	p.line("\t.reg .b32\t%%k<8>;")
	p.line("\t.reg .b32\t%%c<8>;")
	p.line("\t.reg .b32\t%%m<16>;")
	p.line("\t.reg .b32\t%%v<16>;")
	p.line("\t.reg .b32\t%%r<12>;")
	p.line("\t.reg .b64\t%%rd<24>;")
	p.line("")
}

// The blocks of code the MAC chunk kernels share. Their registers: %rd11
// b, the block; %rd9 blocks; %rd13 rem; %rd12 src; %rd19 dst; %p6 the
// bytes are copied; %r4, %r5 the chunk counter; %r6 flags; %r7 the root
// flag; %r8 the block's length; %rd1 the chunk; %p2 the input is one
// chunk. The layout kernels' search: %rd3 pieces, %rd4 count, %rd8 1024c,
// %rd21 lo, %rd30 valid.

// keyCV loads the key into %k0..%k7 and starts the chaining value
// %c0..%c7 as the key.
func (p *ptxText) keyCV(e string) {
	p.loadKey(e)
	p.comment("%c0..%c7 = the chaining value, starting as the key")
	for i := range 8 {
		p.op("mov.b32", "%%c%d, %%k%d", i, i)
	}
}

// chunkBlocks caps rem (%rd13) at a chunk and sets blocks (%rd9), at
// least one.
func (p *ptxText) chunkBlocks() {
	p.op("min.u64", "%%rd13, %%rd13, 1024")
	p.op("add.u64", "%%rd9, %%rd13, 63")
	p.op("shr.u64", "%%rd9, %%rd9, 6")
	p.op("max.u64", "%%rd9, %%rd9, 1")
}

// chunkCounter sets %p2 (the input is one chunk, %rd5 chunks), %r4 and
// %r5 (the counter: the chunk %rd1, named chunk in the comment) and %r7
// (the root flag of the last block).
func (p *ptxText) chunkCounter(chunk string) {
	p.comment("%p2 = the input is one chunk (its end is the root); %r4, %r5 = the counter " + chunk)
	p.op("setp.eq.u64", "%%p2, %%rd5, 1")
	p.op("cvt.u32.u64", "%%r4, %%rd1")
	p.op("shr.u64", "%%rd10, %%rd1, 32")
	p.op("cvt.u32.u64", "%%r5, %%rd10")
	p.op("selp.b32", "%%r7, %d, 0, %%p2", flagRoot)
}

// blockFlags sets %r6, block b's flags, and %r8, its length.
func (p *ptxText) blockFlags() {
	p.op("setp.eq.u64", "%%p3, %%rd11, 0")
	p.op("selp.b32", "%%r6, %d, %d, %%p3", flagKeyed|flagChunkStart, flagKeyed)
	p.op("add.u64", "%%rd14, %%rd11, 1")
	p.op("setp.eq.u64", "%%p4, %%rd14, %%rd9")
	p.op("@%p4 or.b32", "%%r6, %%r6, %d", flagChunkEnd)
	p.op("@%p4 or.b32", "%%r6, %%r6, %%r7")
	p.op("min.u64", "%%rd15, %%rd13, 64")
	p.op("cvt.u32.u64", "%%r8, %%rd15")
}

// partialBlock loads the message %m0..%m15 from the block's bytes at src
// below bound (a register of the bytes left), one at a time, zero-padded,
// copying each to dst under %p6 when copy is set; it ends at LOADED.
func (p *ptxText) partialBlock(bound string, copy bool) {
	for i := range 16 {
		p.op("mov.b32", "%%m%d, 0", i)
	}
	for j := range 64 {
		p.op("setp.le.u64", "%%p5, %s, %d", bound, j)
		p.op("@%p5 bra", "LOADED")
		p.op("ld.global.u8", "%%r9, [%%rd12+%d]", j)
		if copy {
			p.op("@%p6 st.global.u8", "[%%rd19+%d], %%r9", j)
		}
		if j%4 != 0 {
			p.op("shl.b32", "%%r9, %%r9, %d", 8*(j%4))
		}
		p.op("or.b32", "%%m%d, %%m%d, %%r9", j/4, j/4)
	}
}

// compressBlock is LOADED: the block compressed into the chaining value
// %c0..%c7.
func (p *ptxText) compressBlock() {
	p.label("LOADED", "compress the block into the chaining value")
	p.state("%c", "%r4", "%r5", "%r8", "%r6")
	p.compress()
	for i := range 8 {
		p.op("mov.b32", "%%c%d, %%v%d", i, i)
	}
}

// storeCV writes the chaining value to out for the root (%p2), else to
// cvs + 32·%rd1 (chunk, its name in the comment), and ends the kernel.
func (p *ptxText) storeCV(e, chunk string) {
	p.comment("%rd17 = where the chaining value goes: out for the root, else cvs + 32" + chunk)
	p.op("@%p2 bra", "ROOT")
	p.op("ld.param.u64", "%%rd17, [%s_cvs]", e)
	p.op("cvta.to.global.u64", "%%rd17, %%rd17")
	p.op("shl.b64", "%%rd18, %%rd1, 5")
	p.op("add.s64", "%%rd17, %%rd17, %%rd18")
	p.op("bra.uni", "STORE")
	p.label("ROOT", "")
	p.op("ld.param.u64", "%%rd17, [%s_out]", e)
	p.op("cvta.to.global.u64", "%%rd17, %%rd17")
	p.label("STORE", "")
	p.op("st.global.v4.u32", "[%%rd17], {%%c0, %%c1, %%c2, %%c3}")
	p.op("st.global.v4.u32", "[%%rd17+16], {%%c4, %%c5, %%c6, %%c7}")
	p.label("DONE", "")
	p.line("\tret;")
	p.line("}")
}

// searchPiece binary-searches the launch's pieces for the last one at or
// before the chunk: %rd21 = lo, how many start at or before 1024c; it ends
// at FOUND.
func (p *ptxText) searchPiece() {
	p.op("mov.u64", "%%rd21, 0")
	p.op("mov.u64", "%%rd22, %%rd4")
	p.label("SEARCH", "while lo < hi: %rd23 = mid, %rd25 = pieces[mid].at")
	p.op("setp.ge.u64", "%%p1, %%rd21, %%rd22")
	p.op("@%p1 bra", "FOUND")
	p.op("add.u64", "%%rd23, %%rd21, %%rd22")
	p.op("shr.u64", "%%rd23, %%rd23, 1")
	p.op("shl.b64", "%%rd24, %%rd23, 5")
	p.op("add.s64", "%%rd24, %%rd3, %%rd24")
	p.op("ld.global.u64", "%%rd25, [%%rd24]")
	p.op("setp.le.u64", "%%p1, %%rd25, %%rd8")
	p.op("@%p1 add.u64", "%%rd21, %%rd23, 1")
	p.op("@!%p1 mov.u64", "%%rd22, %%rd23")
	p.op("bra.uni", "SEARCH")
}

// placeChunk sets src (%rd12), dst (%rd19, where the piece has one) and
// valid (%rd30) to the chunk's bytes of piece lo - 1, if it has any; it
// ends at PLACED.
func (p *ptxText) placeChunk() {
	p.op("setp.eq.u64", "%%p1, %%rd21, 0")
	p.op("@%p1 bra", "PLACED")
	p.op("sub.u64", "%%rd24, %%rd21, 1")
	p.op("shl.b64", "%%rd24, %%rd24, 5")
	p.op("add.s64", "%%rd24, %%rd3, %%rd24")
	p.op("ld.global.v2.u64", "{%%rd25, %%rd26}, [%%rd24]")
	p.op("ld.global.v2.u64", "{%%rd27, %%rd28}, [%%rd24+16]")
	p.comment("%rd29 = off = 1024c - at; the chunk is past the piece when off >= len")
	p.op("sub.u64", "%%rd29, %%rd8, %%rd25")
	p.op("setp.ge.u64", "%%p1, %%rd29, %%rd28")
	p.op("@%p1 bra", "PLACED")
	p.op("add.s64", "%%rd12, %%rd26, %%rd29")
	p.op("setp.ne.u64", "%%p1, %%rd27, 0")
	p.op("@%p1 add.s64", "%%rd19, %%rd27, %%rd29")
	p.op("sub.u64", "%%rd30, %%rd28, %%rd29")
	p.op("min.u64", "%%rd30, %%rd30, 1024")
}

const macChunksC = `
mac_chunks.ptx: the chunk kernel of MACer, loaded at run time with
cuModuleLoadDataEx (the driver compiles it for the GPU it runs on). One
thread per 1 KiB chunk of BLAKE3's tree, keyed mode. It is this CUDA C,
with compress() BLAKE3's compression function unrolled:

  // Thread g compresses chunk g of buf (n bytes; an empty input is one
  // empty chunk) block by block, the last block zero-padded, and writes
  // its chaining value to cvs[g], or, when the input is a single chunk,
  // the root's output (the MAC) to out. No byte at or past n is read.
  extern "C" __global__ void wc_mac_chunks(const unsigned char *buf, unsigned long long n,
      unsigned long long key01, unsigned long long key23, unsigned long long key45,
      unsigned long long key67, uint4 *cvs, uint4 *out) {
    unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long chunks = max(1ull, (n + 1023) / 1024);
    if (g >= chunks) return;
    unsigned int key[8] = {lo(key01), hi(key01), ..., lo(key67), hi(key67)}, cv[8];
    for (int i = 0; i < 8; i++) cv[i] = key[i];
    const unsigned char *p = buf + 1024 * g;
    unsigned long long rem = min(n - 1024 * g, 1024ull);   // the chunk's bytes
    unsigned long long blocks = max(1ull, (rem + 63) / 64);
    for (unsigned long long b = 0; b < blocks; b++, p += 64, rem -= 64) {
      unsigned int flags = 16 | (b == 0 ? 1 : 0);            // KEYED_HASH, CHUNK_START
      if (b + 1 == blocks) flags |= 2 | (chunks == 1 ? 8 : 0); // CHUNK_END, ROOT
      unsigned int m[16];
      if (rem >= 64 && ((unsigned long long)p & 15) == 0)
        load m from p with four 16-byte loads;
      else
        m = the bytes p[0 .. min(rem, 64)), little-endian words, zero-padded;
      compress(cv, m, (unsigned int)g, (unsigned int)(g >> 32), min(rem, 64ull), flags);
    }
    uint4 *dst = chunks == 1 ? out : cvs + 2 * g;
    dst[0] = {cv[0], cv[1], cv[2], cv[3]}; dst[1] = {cv[4], cv[5], cv[6], cv[7]};
  }
`

func genMACChunks() string {
	const e = "wc_mac_chunks"
	var p ptxText
	p.header("mac_ptx_gen_test.go", macChunksC)
	p.params(e, "u64 buf", "u64 n", "u64 key01", "u64 key23", "u64 key45", "u64 key67", "u64 cvs", "u64 out")
	p.line("{")
	p.macRegisters()
	p.globalThread()
	p.comment("%rd3 = buf, %rd4 = n, %rd5 = chunks; past the last chunk, return")
	p.op("ld.param.u64", "%%rd3, [%s_buf]", e)
	p.op("ld.param.u64", "%%rd4, [%s_n]", e)
	p.op("add.u64", "%%rd5, %%rd4, 1023")
	p.op("shr.u64", "%%rd5, %%rd5, 10")
	p.op("max.u64", "%%rd5, %%rd5, 1")
	p.op("setp.ge.u64", "%%p1, %%rd1, %%rd5")
	p.op("@%p1 bra", "DONE")
	p.op("cvta.to.global.u64", "%%rd3, %%rd3")
	p.keyCV(e)
	p.comment("%rd7 = 1024g, %rd12 = p, %rd13 = rem, %rd9 = blocks, %rd11 = b")
	p.op("shl.b64", "%%rd7, %%rd1, 10")
	p.op("add.s64", "%%rd12, %%rd3, %%rd7")
	p.op("sub.u64", "%%rd13, %%rd4, %%rd7")
	p.chunkBlocks()
	p.op("mov.u64", "%%rd11, 0")
	p.chunkCounter("g")
	p.label("BLOCK", "%r6 = flags, %r8 = the block's length")
	p.blockFlags()
	p.comment("a whole block at a 16-byte aligned address: four 16-byte loads")
	p.op("setp.lt.u64", "%%p5, %%rd13, 64")
	p.op("@%p5 bra", "PARTIAL")
	p.op("and.b64", "%%rd16, %%rd12, 15")
	p.op("setp.ne.u64", "%%p5, %%rd16, 0")
	p.op("@%p5 bra", "PARTIAL")
	for i := range 4 {
		p.op("ld.global.v4.u32", "{%%m%d, %%m%d, %%m%d, %%m%d}, [%%rd12+%d]", 4*i, 4*i+1, 4*i+2, 4*i+3, 16*i)
	}
	p.op("bra.uni", "LOADED")
	p.label("PARTIAL", "the block's bytes below rem, one at a time, zero-padded")
	p.partialBlock("%rd13", false)
	p.compressBlock()
	p.comment("next block")
	p.op("add.u64", "%%rd11, %%rd11, 1")
	p.op("add.s64", "%%rd12, %%rd12, 64")
	p.op("sub.u64", "%%rd13, %%rd13, 64")
	p.op("setp.lt.u64", "%%p3, %%rd11, %%rd9")
	p.op("@%p3 bra", "BLOCK")
	p.storeCV(e, "g")
	return p.b.String()
}

const macParentsC = `
mac_parents.ptx: the parent kernel of MACer, loaded at run time with
cuModuleLoadDataEx (the driver compiles it for the GPU it runs on). It
joins the chaining values that the chunk kernel (or an earlier launch of
this kernel) left in cvs into parent nodes of BLAKE3's tree, keyed mode,
levels levels per launch, in place: node i of tree level shift + s lives
at cvs[i << (shift + s)], so each thread writes only nodes that it alone
reads. Pairs join left to right; an odd last node is carried up as it is.
The launch that reaches the last pair writes the root's output (the MAC)
to out. It is this CUDA C, with compress() BLAKE3's compression function
unrolled:

  // m nodes at level shift; thread g reduces nodes [g << levels,
  // (g + 1) << levels) of it by up to levels levels.
  extern "C" __global__ void wc_mac_parents(uint4 *cvs, unsigned long long m,
      unsigned int shift, unsigned int levels, unsigned long long key01,
      unsigned long long key23, unsigned long long key45, unsigned long long key67,
      uint4 *out) {
    unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int key[8] = {lo(key01), hi(key01), ..., lo(key67), hi(key67)};
    for (unsigned int s = 0; s < levels && m > 1; s++, shift++, m = (m + 1) / 2) {
      unsigned long long lo = g << (levels - s), hi = min(lo + (1ull << (levels - s)), m);
      if (lo >= m) return;
      for (unsigned long long p = lo; p + 1 < hi; p += 2) {
        uint4 *left = cvs + 2 * (p << shift), *right = cvs + 2 * ((p + 1) << shift);
        unsigned int block[16] = {left[0], left[1], right[0], right[1]}, cv[8] = key;
        compress(cv, block, 0, 0, 64, m == 2 ? 16 | 4 | 8 : 16 | 4);  // KEYED_HASH, PARENT, ROOT
        uint4 *dst = m == 2 ? out : left;
        dst[0] = {cv[0], cv[1], cv[2], cv[3]}; dst[1] = {cv[4], cv[5], cv[6], cv[7]};
      }
    }
  }
`

func genMACParents() string {
	const e = "wc_mac_parents"
	var p ptxText
	p.header("mac_ptx_gen_test.go", macParentsC)
	p.params(e, "u64 cvs", "u64 m", "u32 shift", "u32 levels", "u64 key01", "u64 key23", "u64 key45", "u64 key67", "u64 out")
	p.line("{")
	p.macRegisters()
	p.globalThread()
	p.comment("%rd3 = cvs, %rd4 = m, %r4 = shift, %r2 = levels, %r3 = s")
	p.op("ld.param.u64", "%%rd3, [%s_cvs]", e)
	p.op("cvta.to.global.u64", "%%rd3, %%rd3")
	p.op("ld.param.u64", "%%rd4, [%s_m]", e)
	p.op("ld.param.u32", "%%r4, [%s_shift]", e)
	p.op("ld.param.u32", "%%r2, [%s_levels]", e)
	p.op("mov.u32", "%%r3, 0")
	p.loadKey(e)
	p.label("LEVEL", "while s < levels && m > 1")
	p.op("setp.ge.u32", "%%p1, %%r3, %%r2")
	p.op("@%p1 bra", "DONE")
	p.op("setp.le.u64", "%%p1, %%rd4, 1")
	p.op("@%p1 bra", "DONE")
	p.comment("%rd5 = lo, %rd6 = hi; %p2 = this level's pair is the root; %r6 = shift + 5, bytes")
	p.op("sub.u32", "%%r5, %%r2, %%r3")
	p.op("shl.b64", "%%rd5, %%rd1, %%r5")
	p.op("setp.ge.u64", "%%p1, %%rd5, %%rd4")
	p.op("@%p1 bra", "DONE")
	p.op("mov.u64", "%%rd6, 1")
	p.op("shl.b64", "%%rd6, %%rd6, %%r5")
	p.op("add.u64", "%%rd6, %%rd6, %%rd5")
	p.op("min.u64", "%%rd6, %%rd6, %%rd4")
	p.op("setp.eq.u64", "%%p2, %%rd4, 2")
	p.op("selp.b32", "%%r7, %d, %d, %%p2", flagKeyed|flagParent|flagRoot, flagKeyed|flagParent)
	p.op("add.u32", "%%r6, %%r4, 5")
	p.op("mov.u64", "%%rd7, %%rd5")
	p.label("PAIR", "for (p = lo; p + 1 < hi; p += 2): %rd9 = left, %rd10 = right")
	p.op("add.u64", "%%rd8, %%rd7, 1")
	p.op("setp.ge.u64", "%%p1, %%rd8, %%rd6")
	p.op("@%p1 bra", "NEXT")
	p.op("shl.b64", "%%rd9, %%rd7, %%r6")
	p.op("add.s64", "%%rd9, %%rd3, %%rd9")
	p.op("shl.b64", "%%rd10, %%rd8, %%r6")
	p.op("add.s64", "%%rd10, %%rd3, %%rd10")
	p.op("ld.global.v4.u32", "{%%m0, %%m1, %%m2, %%m3}, [%%rd9]")
	p.op("ld.global.v4.u32", "{%%m4, %%m5, %%m6, %%m7}, [%%rd9+16]")
	p.op("ld.global.v4.u32", "{%%m8, %%m9, %%m10, %%m11}, [%%rd10]")
	p.op("ld.global.v4.u32", "{%%m12, %%m13, %%m14, %%m15}, [%%rd10+16]")
	p.state("%k", "0", "0", "64", "%r7")
	p.compress()
	p.op("@%p2 bra", "ROOT")
	p.op("st.global.v4.u32", "[%%rd9], {%%v0, %%v1, %%v2, %%v3}")
	p.op("st.global.v4.u32", "[%%rd9+16], {%%v4, %%v5, %%v6, %%v7}")
	p.op("add.u64", "%%rd7, %%rd7, 2")
	p.op("bra.uni", "PAIR")
	p.label("ROOT", "the last pair: the MAC")
	p.op("ld.param.u64", "%%rd17, [%s_out]", e)
	p.op("cvta.to.global.u64", "%%rd17, %%rd17")
	p.op("st.global.v4.u32", "[%%rd17], {%%v0, %%v1, %%v2, %%v3}")
	p.op("st.global.v4.u32", "[%%rd17+16], {%%v4, %%v5, %%v6, %%v7}")
	p.op("bra.uni", "DONE")
	p.label("NEXT", "the next level: m = (m + 1) / 2")
	p.op("add.u64", "%%rd4, %%rd4, 1")
	p.op("shr.u64", "%%rd4, %%rd4, 1")
	p.op("add.u32", "%%r3, %%r3, 1")
	p.op("add.u32", "%%r4, %%r4, 1")
	p.op("bra.uni", "LEVEL")
	p.label("DONE", "")
	p.line("\tret;")
	p.line("}")
	return p.b.String()
}

const macLayoutC = `
mac_layout.ptx: the layout chunk kernel of MACer (Gather.CopyMACLayout),
loaded at run time with cuModuleLoadDataEx (the driver compiles it for the
GPU it runs on). As mac_chunks.ptx, one thread per 1 KiB chunk of BLAKE3's
tree, keyed mode, but of a layout (gpu.Layout) rather than a buffer: pieces
of device memory placed in an n-byte virtual input whose every other byte
is zero, each piece starting on a chunk (a multiple of 1024), so that a
chunk holds bytes of at most one piece. A piece's bytes are copied to its
destination on the way, unless that is 0.

A thread alone would read and write its chunk 64 bytes at a time, 1 KiB
away from its neighbours': writes of a warp that hit 32 half-filled
sectors, which ran at half the speed of the MAC alone. So the 128 threads
of a block move their chunks together, one 64-byte row of each chunk at a
time: each row of the block's chunks is loaded and written by four
threads per chunk (whole 64-byte runs, whole sectors) into the
destinations and into shared memory, where each thread then reads its
chunk's row to compress it. Two row buffers take turns: a thread loads its
share of the next row before it compresses its chunk's row and stores it
after, so that the loads' latency hides behind the compression and a block
waits at one barrier a row. A row of a chunk whose source or destination
is not 16-byte aligned, or that holds the piece's last bytes but not 64 of
them, its thread reads (and writes) a byte at a time. It is this CUDA C,
with compress() BLAKE3's compression function unrolled:

  // pieces: count (at, src, dst, len) quadruples sorted by at, those that
  // start in chunks [c0, c1) (the launch's), none of whose chunks holds
  // bytes of a piece of another launch. Blocks of 128 threads; thread g
  // compresses chunk c = c0 + g as wc_mac_chunks does, the chunk's bytes
  // of its piece read at the piece's source and written to its
  // destination; no byte outside a piece is read or written.
  extern "C" __global__ void __launch_bounds__(128) wc_mac_layout(const ulonglong4 *pieces,
      unsigned long long count, unsigned long long c0, unsigned long long c1, unsigned long long n,
      unsigned long long key01, unsigned long long key23, unsigned long long key45,
      unsigned long long key67, uint4 *cvs, uint4 *out) {
    __shared__ unsigned long long S[128], D[128], V[128];  // each chunk's src, dst, vector bytes
    __shared__ uint4 row[2][128][5];                       // a row of each chunk, padded; two
    unsigned t = threadIdx.x;
    unsigned long long c = c0 + (unsigned long long)blockIdx.x * 128 + t;
    unsigned long long chunks = max(1ull, (n + 1023) / 1024);
    const unsigned char *src = 0; unsigned char *dst = 0;
    unsigned long long valid = 0, rem = 0, blocks = 0;  // the chunk's bytes of a piece, of the input
    if (c < c1) {
      unsigned long long lo = 0, hi = count;      // the pieces at or before the chunk
      while (lo < hi) {
        unsigned long long mid = (lo + hi) / 2;
        if (pieces[mid].x <= 1024 * c) lo = mid + 1; else hi = mid;
      }
      if (lo > 0 && 1024 * c - pieces[lo - 1].x < pieces[lo - 1].w) {
        ulonglong4 q = pieces[lo - 1]; unsigned long long off = 1024 * c - q.x;
        src = q.y + off; dst = q.z ? q.z + off : 0; valid = min(q.w - off, 1024ull);
      }
      rem = min(n - 1024 * c, 1024ull);
      blocks = max(1ull, (rem + 63) / 64);
    }
    bool vec = (((unsigned long long)src | (unsigned long long)dst) & 15) == 0;
    S[t] = src; D[t] = dst; V[t] = vec ? valid : 0;
    __syncthreads();
    unsigned int key[8] = {lo(key01), hi(key01), ..., lo(key67), hi(key67)}, cv[8];
    for (int i = 0; i < 8; i++) cv[i] = key[i];
    uint4 x[4];  // this thread's 16 bytes of a row of chunks 32k + t / 4, k < 4
    #define LOAD(b) for (int k = 0; k < 4; k++) { unsigned ch = 32 * k + t / 4, off = 64 * (b) + 16 * (t % 4); \
        if (V[ch] >= off + 16) x[k] = *(const uint4 *)(S[ch] + off); }
    #define STORE(b) for (int k = 0; k < 4; k++) { unsigned ch = 32 * k + t / 4, off = 64 * (b) + 16 * (t % 4); \
        if (V[ch] >= off + 16) { row[(b) % 2][ch][t % 4] = x[k]; if (D[ch]) *(uint4 *)(D[ch] + off) = x[k]; } }
    LOAD(0); STORE(0);
    __syncthreads();
    for (unsigned b = 0; b < 16; b++) {
      if (b + 1 < 16) LOAD(b + 1);
      if (b < blocks) {
        unsigned int flags = 16 | (b == 0 ? 1 : 0);            // KEYED_HASH, CHUNK_START
        if (b + 1 == blocks) flags |= 2 | (chunks == 1 ? 8 : 0); // CHUNK_END, ROOT
        unsigned int m[16];
        if (vec && valid >= 64)
          m = row[b % 2][t][0..3];
        else {
          m = the bytes src[0 .. min(valid, 64)), little-endian words, zero-padded;
          if (dst) copy those bytes to dst one at a time;
        }
        compress(cv, m, (unsigned int)c, (unsigned int)(c >> 32), min(rem, 64ull), flags);
        src += 64; dst += dst ? 64 : 0; rem -= 64; valid = max(valid, 64ull) - 64;
      }
      if (b + 1 < 16) STORE(b + 1);
      __syncthreads();
    }
    if (c >= c1) return;
    uint4 *to = chunks == 1 ? out : cvs + 2 * c;
    to[0] = {cv[0], cv[1], cv[2], cv[3]}; to[1] = {cv[4], cv[5], cv[6], cv[7]};
  }
`

// macLayoutRowPad is the bytes of shared memory a chunk's row takes: 64,
// padded to 80 so that the threads reading their rows spread over the
// banks.
const macLayoutRowPad = 80

// genMACLayout writes mac_layout.ptx. Its registers past the compression's
// (%m, %v, %k, %c): %rd1 g, then c; %rd3 pieces; %rd4 count; %rd5 c0 and
// then chunks; %rd6 c1; %rd7 n; %rd8 1024c; %rd9 blocks; %rd11 b; %rd12
// src; %rd13 rem; %rd19 dst; %rd30 valid; %rd21..%rd29, %rd31 scratch; %r11
// t; %r12..%r19 shared addresses and scratch; %p8 the thread has a chunk;
// %p9 its bytes go by vectors.
func genMACLayout() string {
	const e = "wc_mac_layout"
	sh := func(name string) string { return e + "_" + name }
	var p ptxText
	p.header("mac_ptx_gen_test.go", macLayoutC)
	p.params(e, "u64 pieces", "u64 count", "u64 c0", "u64 c1", "u64 n", "u64 key01", "u64 key23", "u64 key45", "u64 key67", "u64 cvs", "u64 out")
	p.line(".maxntid %d, 1, 1", macThreads)
	p.line("{")
	p.line("\t.reg .pred\t%%p<16>;")
	p.line("\t.reg .b32\t%%k<8>;")
	p.line("\t.reg .b32\t%%c<8>;")
	p.line("\t.reg .b32\t%%m<16>;")
	p.line("\t.reg .b32\t%%v<16>;")
	p.line("\t.reg .b32\t%%x<16>;")
	p.line("\t.reg .b32\t%%r<24>;")
	p.line("\t.reg .b64\t%%rd<56>;")
	for _, a := range []string{"src", "dst", "valid"} {
		p.line("\t.shared .align 8 .b8 %s[%d];", sh(a), 8*macThreads)
	}
	p.line("\t.shared .align 16 .b8 %s[%d];", sh("row"), 2*macLayoutRowPad*macThreads)
	p.line("")
	p.globalThread()
	p.op("mov.u32", "%%r11, %%r3")
	p.comment("%rd1 = c = c0 + g; %p8 = c < c1, the thread has a chunk")
	p.op("ld.param.u64", "%%rd5, [%s_c0]", e)
	p.op("ld.param.u64", "%%rd6, [%s_c1]", e)
	p.op("add.u64", "%%rd1, %%rd1, %%rd5")
	p.op("setp.lt.u64", "%%p8, %%rd1, %%rd6")
	p.comment("%rd3 = pieces, %rd4 = count, %rd7 = n, %rd5 = chunks, %rd8 = 1024c")
	p.op("ld.param.u64", "%%rd3, [%s_pieces]", e)
	p.op("cvta.to.global.u64", "%%rd3, %%rd3")
	p.op("ld.param.u64", "%%rd4, [%s_count]", e)
	p.op("ld.param.u64", "%%rd7, [%s_n]", e)
	p.op("add.u64", "%%rd5, %%rd7, 1023")
	p.op("shr.u64", "%%rd5, %%rd5, 10")
	p.op("max.u64", "%%rd5, %%rd5, 1")
	p.op("shl.b64", "%%rd8, %%rd1, 10")
	p.comment("%rd12 = src, %rd19 = dst, %rd30 = valid, %rd13 = rem, %rd9 = blocks: none without a chunk")
	p.op("mov.u64", "%%rd12, 0")
	p.op("mov.u64", "%%rd19, 0")
	p.op("mov.u64", "%%rd30, 0")
	p.op("mov.u64", "%%rd13, 0")
	p.op("mov.u64", "%%rd9, 0")
	p.op("@!%p8 bra", "SHARE")
	p.comment("binary search: %rd21 = lo, the number of pieces at or before 1024c; %rd22 = hi")
	p.searchPiece()
	p.label("FOUND", "the chunk's bytes of piece lo - 1, if any")
	p.placeChunk()
	p.label("PLACED", "rem, blocks")
	p.op("sub.u64", "%%rd13, %%rd7, %%rd8")
	p.chunkBlocks()
	p.label("SHARE", "%p9 = src and dst 16-byte aligned; S[t], D[t], V[t] = src, dst, valid or 0")
	p.op("or.b64", "%%rd21, %%rd12, %%rd19")
	p.op("and.b64", "%%rd21, %%rd21, 15")
	p.op("setp.eq.u64", "%%p9, %%rd21, 0")
	p.op("selp.b64", "%%rd21, %%rd30, 0, %%p9")
	p.op("shl.b32", "%%r12, %%r11, 3")
	p.op("mov.u32", "%%r13, %s", sh("src"))
	p.op("add.u32", "%%r13, %%r13, %%r12")
	p.op("st.shared.u64", "[%%r13], %%rd12")
	p.op("mov.u32", "%%r13, %s", sh("dst"))
	p.op("add.u32", "%%r13, %%r13, %%r12")
	p.op("st.shared.u64", "[%%r13], %%rd19")
	p.op("mov.u32", "%%r13, %s", sh("valid"))
	p.op("add.u32", "%%r13, %%r13, %%r12")
	p.op("st.shared.u64", "[%%r13], %%rd21")
	p.op("bar.sync", "0")
	p.comment("%p6 = the chunk's bytes are copied; %r14 = t %% 4; %r15 = 8(t / 4); %rd52 = 16(t %% 4)")
	p.op("setp.ne.u64", "%%p6, %%rd19, 0")
	p.op("and.b32", "%%r14, %%r11, 3")
	p.op("shr.u32", "%%r15, %%r11, 2")
	p.op("shl.b32", "%%r15, %%r15, 3")
	p.op("mul.wide.u32", "%%rd52, %%r14, 16")
	p.comment("the four chunks ch = 32k + t / 4 whose rows this thread moves: S, D, V in %rd40+k, %rd44+k, %rd48+k")
	for k := range 4 {
		p.op("add.u32", "%%r17, %%r15, %d", 8*32*k)
		for j, a := range []string{"src", "dst", "valid"} {
			p.op("mov.u32", "%%r18, %s", sh(a))
			p.op("add.u32", "%%r18, %%r18, %%r17")
			p.op("ld.shared.u64", "%%rd%d, [%%r18]", 40+4*j+k)
		}
	}
	p.comment("%r20 = row[t / 4][t % 4] of the first row buffer (chunk ch's slot: %r20 + 2560k); %r16 = row[t] of it")
	p.op("mul.lo.u32", "%%r20, %%r15, %d", macLayoutRowPad/8)
	p.op("shl.b32", "%%r18, %%r14, 4")
	p.op("add.u32", "%%r20, %%r20, %%r18")
	p.op("mov.u32", "%%r18, %s", sh("row"))
	p.op("add.u32", "%%r20, %%r20, %%r18")
	p.op("mul.lo.u32", "%%r17, %%r11, %d", macLayoutRowPad)
	p.op("add.u32", "%%r16, %%r18, %%r17")
	// loadRow loads, into %x, this thread's 16 bytes of row %rd(b) of its
	// four chunks, those that have them by vectors (%p10+k); storeRow
	// writes them to the row buffer of that row and to the chunks'
	// destinations. Between the two the thread compresses the row before,
	// so that the loads' latency hides behind the compression.
	loadRow := func(b int) {
		p.comment(fmt.Sprintf("load row %%rd%d: %%rd31 = off = 64b + 16(t %% 4); %%p10+k = V >= off + 16", b))
		p.op("shl.b64", "%%rd31, %%rd%d, 6", b)
		p.op("add.u64", "%%rd31, %%rd31, %%rd52")
		p.op("add.u64", "%%rd22, %%rd31, 16")
		for k := range 4 {
			p.op("setp.ge.u64", "%%p%d, %%rd%d, %%rd22", 10+k, 48+k)
			p.op("add.s64", "%%rd24, %%rd%d, %%rd31", 40+k)
			p.op(fmt.Sprintf("@%%p%d ld.global.v4.u32", 10+k), "{%%x%d, %%x%d, %%x%d, %%x%d}, [%%rd24]", 4*k, 4*k+1, 4*k+2, 4*k+3)
		}
	}
	storeRow := func(b int, tag string) {
		p.comment(fmt.Sprintf("store row %%rd%d: into row buffer (b %% 2), %%r21 = %%r20 + 10240(b %% 2), and to the destinations", b))
		p.op("cvt.u32.u64", "%%r21, %%rd%d", b)
		p.op("and.b32", "%%r21, %%r21, 1")
		p.op("mul.lo.u32", "%%r21, %%r21, %d", macLayoutRowPad*macThreads)
		p.op("add.u32", "%%r21, %%r21, %%r20")
		for k := range 4 {
			skip := fmt.Sprintf("%s%d", tag, k)
			p.op(fmt.Sprintf("@!%%p%d bra", 10+k), "%s", skip)
			p.op("st.shared.v4.u32", "[%%r21+%d], {%%x%d, %%x%d, %%x%d, %%x%d}", 2560*k, 4*k, 4*k+1, 4*k+2, 4*k+3)
			p.op("setp.eq.u64", "%%p1, %%rd%d, 0", 44+k)
			p.op("@%p1 bra", "%s", skip)
			p.op("add.s64", "%%rd25, %%rd%d, %%rd31", 44+k)
			p.op("st.global.v4.u32", "[%%rd25], {%%x%d, %%x%d, %%x%d, %%x%d}", 4*k, 4*k+1, 4*k+2, 4*k+3)
			p.label(skip, "")
		}
	}
	p.keyCV(e)
	p.chunkCounter("c; %rd11 = b")
	p.op("mov.u64", "%%rd11, 0")
	p.comment("row 0 of every chunk of the block, four threads a chunk")
	loadRow(11)
	storeRow(11, "FIRST")
	p.op("bar.sync", "0")
	p.label("ROW", "row b: load row b + 1 (%rd53), compress row b, store row b + 1 (%p15: there is one)")
	p.op("add.u64", "%%rd53, %%rd11, 1")
	p.op("setp.lt.u64", "%%p15, %%rd53, 16")
	p.op("@!%p15 bra", "LOADED1")
	loadRow(53)
	p.label("LOADED1", "")
	p.comment("this thread's chunk, if it has row b: %r6 = flags, %r8 = the block's length")
	p.op("setp.ge.u64", "%%p3, %%rd11, %%rd9")
	p.op("@%p3 bra", "ROWDONE")
	p.blockFlags()
	p.comment("a whole row moved by vectors: from row buffer (b % 2), at %r22 = %r16 + 10240(b % 2)")
	p.op("@!%p9 bra", "PARTIAL")
	p.op("setp.lt.u64", "%%p5, %%rd30, 64")
	p.op("@%p5 bra", "PARTIAL")
	p.op("cvt.u32.u64", "%%r22, %%rd11")
	p.op("and.b32", "%%r22, %%r22, 1")
	p.op("mul.lo.u32", "%%r22, %%r22, %d", macLayoutRowPad*macThreads)
	p.op("add.u32", "%%r22, %%r22, %%r16")
	for i := range 4 {
		p.op("ld.shared.v4.u32", "{%%m%d, %%m%d, %%m%d, %%m%d}, [%%r22+%d]", 4*i, 4*i+1, 4*i+2, 4*i+3, 16*i)
	}
	p.op("bra.uni", "LOADED")
	p.label("PARTIAL", "the block's bytes of the piece (below valid), one at a time, zero-padded")
	p.partialBlock("%rd30", true)
	p.compressBlock()
	p.comment("next block: valid = max(valid, 64) - 64")
	p.op("add.s64", "%%rd12, %%rd12, 64")
	p.op("@%p6 add.s64", "%%rd19, %%rd19, 64")
	p.op("sub.u64", "%%rd13, %%rd13, 64")
	p.op("max.u64", "%%rd30, %%rd30, 64")
	p.op("sub.u64", "%%rd30, %%rd30, 64")
	p.label("ROWDONE", "")
	p.op("@!%p15 bra", "STORED")
	storeRow(53, "NEXT")
	p.label("STORED", "every thread, before the next row overwrites a row buffer")
	p.op("bar.sync", "0")
	p.op("add.u64", "%%rd11, %%rd11, 1")
	p.op("setp.lt.u64", "%%p3, %%rd11, 16")
	p.op("@%p3 bra", "ROW")
	p.op("@!%p8 bra", "DONE")
	p.storeCV(e, "c")
	return p.b.String()
}

const macLayoutReadC = `
mac_layout_read.ptx: the layout chunk kernel of MACer (Gather.CopyMACLayout)
for layouts whose pieces are only read, loaded at run time with
cuModuleLoadDataEx (the driver compiles it for the GPU it runs on). The
layout as mac_layout.ptx takes it, one thread per 1 KiB chunk, each on its
own: with no copies to write, its threads need not move their rows
together, and it runs without mac_layout.ptx's barriers. (It can copy as
well, a thread's chunk 64 bytes at a time, at half the speed of
mac_layout.ptx.) It is this CUDA C, with compress() BLAKE3's compression
function unrolled:

  // pieces: count (at, src, dst, len) quadruples sorted by at, those that
  // start in chunks [c0, c1) (the launch's), none of whose chunks holds
  // bytes of a piece of another launch. Thread g compresses chunk
  // c = c0 + g as wc_mac_chunks does, the chunk's bytes of its piece read
  // at the piece's source and written to its destination; no byte outside
  // a piece is read or written.
  extern "C" __global__ void wc_mac_layout_read(const ulonglong4 *pieces, unsigned long long count,
      unsigned long long c0, unsigned long long c1, unsigned long long n,
      unsigned long long key01, unsigned long long key23, unsigned long long key45,
      unsigned long long key67, uint4 *cvs, uint4 *out) {
    unsigned long long c = c0 + (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long chunks = max(1ull, (n + 1023) / 1024);
    if (c >= c1) return;
    unsigned long long lo = 0, hi = count;        // the pieces at or before the chunk
    while (lo < hi) {
      unsigned long long mid = (lo + hi) / 2;
      if (pieces[mid].x <= 1024 * c) lo = mid + 1; else hi = mid;
    }
    const unsigned char *src = 0; unsigned char *dst = 0;
    unsigned long long valid = 0;                 // the chunk's bytes of a piece
    if (lo > 0 && 1024 * c - pieces[lo - 1].x < pieces[lo - 1].w) {
      ulonglong4 q = pieces[lo - 1]; unsigned long long off = 1024 * c - q.x;
      src = q.y + off; dst = q.z ? q.z + off : 0; valid = min(q.w - off, 1024ull);
    }
    unsigned int key[8] = {lo(key01), hi(key01), ..., lo(key67), hi(key67)}, cv[8];
    for (int i = 0; i < 8; i++) cv[i] = key[i];
    unsigned long long rem = min(n - 1024 * c, 1024ull);   // the chunk's bytes
    unsigned long long blocks = max(1ull, (rem + 63) / 64);
    for (unsigned long long b = 0; b < blocks; b++, src += 64, dst += dst ? 64 : 0,
         rem -= 64, valid = max(valid, 64ull) - 64) {
      unsigned int flags = 16 | (b == 0 ? 1 : 0);            // KEYED_HASH, CHUNK_START
      if (b + 1 == blocks) flags |= 2 | (chunks == 1 ? 8 : 0); // CHUNK_END, ROOT
      unsigned int m[16];
      if (valid >= 64 && ((unsigned long long)src & 15) == 0 && ((unsigned long long)dst & 15) == 0) {
        load m from src with four 16-byte loads;
        if (dst) store m to dst with four 16-byte stores;
      } else {
        m = the bytes src[0 .. min(valid, 64)), little-endian words, zero-padded;
        if (dst) copy those bytes to dst one at a time;
      }
      compress(cv, m, (unsigned int)c, (unsigned int)(c >> 32), min(rem, 64ull), flags);
    }
    uint4 *to = chunks == 1 ? out : cvs + 2 * c;
    to[0] = {cv[0], cv[1], cv[2], cv[3]}; to[1] = {cv[4], cv[5], cv[6], cv[7]};
  }
`

// genMACLayoutRead writes mac_layout_read.ptx. Its registers past the compression's
// (%m, %v, %k, %c): %rd1 g, then c; %rd3 pieces; %rd4 count; %rd5 c0 and
// then chunks; %rd6 c1; %rd7 n; %rd8 1024c; %rd9 blocks; %rd11 b; %rd12
// src; %rd13 rem; %rd19 dst; %rd30 valid; %rd21..%rd29 scratch.
func genMACLayoutRead() string {
	const e = "wc_mac_layout_read"
	var p ptxText
	p.header("mac_ptx_gen_test.go", macLayoutReadC)
	p.params(e, "u64 pieces", "u64 count", "u64 c0", "u64 c1", "u64 n", "u64 key01", "u64 key23", "u64 key45", "u64 key67", "u64 cvs", "u64 out")
	p.line("{")
	p.line("\t.reg .pred\t%%p<8>;")
	p.line("\t.reg .b32\t%%k<8>;")
	p.line("\t.reg .b32\t%%c<8>;")
	p.line("\t.reg .b32\t%%m<16>;")
	p.line("\t.reg .b32\t%%v<16>;")
	p.line("\t.reg .b32\t%%r<12>;")
	p.line("\t.reg .b64\t%%rd<32>;")
	p.line("")
	p.globalThread()
	p.comment("%rd1 = c = c0 + g; past the launch's last chunk, return")
	p.op("ld.param.u64", "%%rd5, [%s_c0]", e)
	p.op("ld.param.u64", "%%rd6, [%s_c1]", e)
	p.op("add.u64", "%%rd1, %%rd1, %%rd5")
	p.op("setp.ge.u64", "%%p1, %%rd1, %%rd6")
	p.op("@%p1 bra", "DONE")
	p.comment("%rd3 = pieces, %rd4 = count, %rd7 = n, %rd5 = chunks, %rd8 = 1024c")
	p.op("ld.param.u64", "%%rd3, [%s_pieces]", e)
	p.op("cvta.to.global.u64", "%%rd3, %%rd3")
	p.op("ld.param.u64", "%%rd4, [%s_count]", e)
	p.op("ld.param.u64", "%%rd7, [%s_n]", e)
	p.op("add.u64", "%%rd5, %%rd7, 1023")
	p.op("shr.u64", "%%rd5, %%rd5, 10")
	p.op("max.u64", "%%rd5, %%rd5, 1")
	p.op("shl.b64", "%%rd8, %%rd1, 10")
	p.comment("binary search: %rd21 = lo, the number of pieces at or before 1024c; %rd22 = hi")
	p.searchPiece()
	p.label("FOUND", "%rd12 = src, %rd19 = dst, %rd30 = valid: the chunk's bytes of piece lo - 1, if any")
	p.op("mov.u64", "%%rd12, 0")
	p.op("mov.u64", "%%rd19, 0")
	p.op("mov.u64", "%%rd30, 0")
	p.placeChunk()
	p.label("PLACED", "%p6 = the chunk's bytes are copied")
	p.op("setp.ne.u64", "%%p6, %%rd19, 0")
	p.keyCV(e)
	p.comment("%rd13 = rem, %rd9 = blocks, %rd11 = b")
	p.op("sub.u64", "%%rd13, %%rd7, %%rd8")
	p.chunkBlocks()
	p.op("mov.u64", "%%rd11, 0")
	p.chunkCounter("c")
	p.label("BLOCK", "%r6 = flags, %r8 = the block's length")
	p.blockFlags()
	p.comment("64 bytes of the piece, src and dst 16-byte aligned: four 16-byte loads (and stores)")
	p.op("setp.lt.u64", "%%p5, %%rd30, 64")
	p.op("@%p5 bra", "PARTIAL")
	p.op("or.b64", "%%rd16, %%rd12, %%rd19")
	p.op("and.b64", "%%rd16, %%rd16, 15")
	p.op("setp.ne.u64", "%%p5, %%rd16, 0")
	p.op("@%p5 bra", "PARTIAL")
	for i := range 4 {
		p.op("ld.global.v4.u32", "{%%m%d, %%m%d, %%m%d, %%m%d}, [%%rd12+%d]", 4*i, 4*i+1, 4*i+2, 4*i+3, 16*i)
	}
	p.op("@!%p6 bra", "LOADED")
	for i := range 4 {
		p.op("st.global.v4.u32", "[%%rd19+%d], {%%m%d, %%m%d, %%m%d, %%m%d}", 16*i, 4*i, 4*i+1, 4*i+2, 4*i+3)
	}
	p.op("bra.uni", "LOADED")
	p.label("PARTIAL", "the block's bytes of the piece (below valid), one at a time, zero-padded")
	p.partialBlock("%rd30", true)
	p.compressBlock()
	p.comment("next block: valid = max(valid, 64) - 64")
	p.op("add.u64", "%%rd11, %%rd11, 1")
	p.op("add.s64", "%%rd12, %%rd12, 64")
	p.op("@%p6 add.s64", "%%rd19, %%rd19, 64")
	p.op("sub.u64", "%%rd13, %%rd13, 64")
	p.op("max.u64", "%%rd30, %%rd30, 64")
	p.op("sub.u64", "%%rd30, %%rd30, 64")
	p.op("setp.lt.u64", "%%p3, %%rd11, %%rd9")
	p.op("@%p3 bra", "BLOCK")
	p.storeCV(e, "c")
	return p.b.String()
}
