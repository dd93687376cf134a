package gpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// This file holds a small interpreter of the PTX subset that the package's
// kernels (gather.ptx, checksum.ptx, cast.ptx, ...) are written in, so
// that their text and logic are checked where no GPU is. It checks what
// the PTX assembler would refuse and what would fault on a GPU:
//
//   - every register is declared, every label defined once, every
//     instruction known, and each operand has the width (register class)
//     that the PTX ISA requires of it: for example add.u64 takes 64-bit
//     registers, a shift amount is 32-bit, setp writes a predicate, and
//     and/or/xor/shl take only .b types, add/sub/mul/min/max only .u/.s;
//   - immediates fit the operand's width and appear only where nvcc puts
//     them (the last source, selp's values, mov's source);
//   - bra.uni is never guarded by a predicate (it must not diverge), nor
//     is a shfl.sync or bar.sync; loads and stores carry only cache
//     qualifiers of the forms the PTX ISA gives, in its order;
//   - at run time, no register is read before it is written, every memory
//     access lies inside a region given to the kernel and is aligned to
//     its full size (a vector access to the vector's size), and nothing is
//     written to a region marked read-only; blocks have at most the
//     threads of the kernel's .maxntid.
//
// Each instruction is executed as the PTX ISA defines it, at its type's
// width: results are truncated to the width, shifts past the width give 0
// (shr.s the sign), setp compares signed for .s types, loads zero-extend
// into a wider register, stores write the low bytes.
//
// Each thread of a block runs on its own until it returns or reaches a
// collective instruction: shfl.sync (the lanes of a warp exchange
// registers) or bar.sync (the threads of the block wait for each other).
// Once every thread it involves waits at it, the block executes it for
// all of them; what would hang or be undefined on a GPU is refused: a
// warp's lanes at different instructions or exited, a partial warp, a
// barrier that some threads exited before. Otherwise threads run one
// after another: threads touch the same global memory only through red
// and atom (atomic) operations, and a block's shared memory (whose bytes
// must be written before they are read) only on either side of a barrier,
// so any order gives the same result. Blocks run one after another, in
// the order runBlocks is given, so that a test can make any block the
// last to finish (the checksum kernels' ticket). The PTX compiler's own checks happen on a
// GPU only (the GPU tests, and the self-test each device runs before
// using a kernel).

// The special registers, at fixed register numbers.
const (
	ptxTid = iota
	ptxNtid
	ptxCtaid
	ptxNctaid
	ptxSpecials
)

var ptxSpecialNames = [ptxSpecials]string{"%tid.x", "%ntid.x", "%ctaid.x", "%nctaid.x"}

type ptxArgKind uint8

const (
	argReg   ptxArgKind = iota + 1 // %r1
	argImm                         // 42, -1, 0xff
	argMem                         // [%rd1], [%rd1+8]
	argParam                       // [name] of a kernel parameter
	argVec                         // {%rd1, %rd2}
)

type ptxArg struct {
	kind ptxArgKind
	reg  int    // argReg, argMem; the parameter's index for argParam
	imm  uint64 // argImm (truncated to the operand's width), argMem offset
	vec  []int  // argVec
	text string
}

type ptxCode uint8

const (
	cRet ptxCode = iota + 1
	cBra
	cLdParam
	cMov
	cCvt
	cSetp
	cSelp
	cBin
	cMulWide // mul.wide.u32; mad.wide.u32 (sub "mad")
	cClz
	cShf
	cPrmt
	cLd
	cSt
	cRed
	cAtom   // atom.global.add.u32, atom.global.exch.b64, atom.global.max.u64 (sub "add", "exch" or "max"): the old value into d
	cMembar // membar.gl: threads run one after another here, so nothing to order
	cShfl   // shfl.sync.bfly.b32, executed by the block for a whole warp
	cBar    // bar.sync 0, executed by the block for all its threads
	cPack   // mov.b64 d, {lo, hi}
	cUnpack // mov.b64 {lo, hi}, a
	cDiv    // div.u32, rem.u32 (sub "div" or "rem")
	cDivF32 // div.rn.f32, mul.rn.f32, add.rn.f32: IEEE 754, rounded to nearest even
	cF8     // fma.rn.f32, cvt.rn.satfinite.e4m3x2.f32, cvt.f32.f16, max.u16x2 (ptx_interp_f8_test.go)
)

type ptxInst struct {
	line   int
	op     string // "ld.global.v2.u64"
	code   ptxCode
	sub    string // cBin: add, sub, mul, and, or, xor, shl, shr, min, max; cSetp: the comparison
	width  uint   // the instruction type's width in bits; cCvt: the destination's
	srcW   uint   // cCvt: the source type's width
	signed bool   // the instruction type is .sN (cCvt: the source type)
	vec    int    // ld, st: elements (1, 2 or 4)
	shared bool   // ld, st: of shared memory (else global)
	guard  int    // predicate register, -1 for none
	negate bool
	args   []ptxArg
	target int // cBra: instruction index
}

type ptxKernel struct {
	file      string
	name      string
	params    []string
	paramSize []int
	regName   []string
	regWidth  []uint // 1 for predicates
	regKind   []byte // the declared type's letter: 'b', 'u', 's', 'f', or 'p' for predicates
	regIdx    map[string]int
	insts     []ptxInst
	labels    map[string]int
	counts    []int // executions of each instruction, over every run

	shared     map[string]uint64 // the .shared arrays' addresses
	sharedSize int               // bytes of shared memory a block has
	maxntid    int               // .maxntid: the most threads a block may have (0: any)
}

// parsePTX parses the one kernel of a PTX file and checks it statically;
// file names it in messages.
func parsePTX(t testing.TB, file, src string) *ptxKernel {
	t.Helper()
	k, err := compilePTX(file, src)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// compilePTX is parsePTX returning its error.
func compilePTX(file, src string) (*ptxKernel, error) {
	k := &ptxKernel{file: file, regIdx: map[string]int{}, labels: map[string]int{}, shared: map[string]uint64{}}
	for i, n := range ptxSpecialNames {
		k.regIdx[n] = i
		k.regName = append(k.regName, n)
		k.regWidth = append(k.regWidth, 32)
		k.regKind = append(k.regKind, 'u')
	}
	type pending struct {
		line   int
		target string
	}
	var branches []pending
	var sawVersion, sawTarget, inParams, inBody bool
	for n, raw := range strings.Split(src, "\n") {
		line := raw
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		fail := func(format string, a ...any) (*ptxKernel, error) {
			return nil, fmt.Errorf("%s:%d: %s: %q", file, n+1, fmt.Sprintf(format, a...), strings.TrimSpace(raw))
		}
		switch {
		case strings.HasPrefix(line, ".version "):
			if line != ".version 8.0" {
				return fail("want .version 8.0")
			}
			sawVersion = true
			continue
		case strings.HasPrefix(line, ".target "):
			if !sawVersion {
				return fail(".target before .version")
			}
			if line != ".target sm_90" {
				return fail("want .target sm_90")
			}
			sawTarget = true
			continue
		case strings.HasPrefix(line, ".address_size "):
			if line != ".address_size 64" {
				return fail("want 64-bit addresses")
			}
			continue
		case strings.HasPrefix(line, ".visible .entry "):
			if !sawTarget {
				return fail("kernel before .target")
			}
			if k.name != "" {
				return fail("a second kernel: the interpreter takes one per file")
			}
			k.name = strings.TrimSuffix(strings.TrimPrefix(line, ".visible .entry "), "(")
			inParams = true
			continue
		case inParams && line == ")":
			inParams = false
			continue
		case inParams:
			f := strings.Fields(strings.TrimSuffix(line, ","))
			size := map[string]int{".u32": 4, ".u64": 8}
			if len(f) != 3 || f[0] != ".param" || size[f[1]] == 0 {
				return fail("bad parameter (want .param .u32 or .u64 name)")
			}
			k.params = append(k.params, f[2])
			k.paramSize = append(k.paramSize, size[f[1]])
			continue
		case k.name != "" && !inParams && !inBody && strings.HasPrefix(line, ".maxntid "):
			dims := strings.Split(strings.TrimPrefix(line, ".maxntid "), ",")
			x, err := strconv.Atoi(strings.TrimSpace(dims[0]))
			if len(dims) != 3 || err != nil || x <= 0 || x > 1024 || strings.TrimSpace(dims[1]) != "1" || strings.TrimSpace(dims[2]) != "1" {
				return fail("want .maxntid N, 1, 1 with N at most 1024")
			}
			k.maxntid = x
			continue
		case k.name != "" && !inParams && !inBody && strings.HasPrefix(line, ".minnctapersm "):
			if n, err := strconv.Atoi(strings.TrimPrefix(line, ".minnctapersm ")); err != nil || n <= 0 {
				return fail("want .minnctapersm N")
			}
			if k.maxntid == 0 {
				return fail(".minnctapersm without .maxntid before it means nothing to ptxas")
			}
			continue
		case strings.HasPrefix(line, ".shared "):
			f := strings.Fields(strings.TrimSuffix(line, ";"))
			var align, size int
			var name string
			ok := len(f) == 5 && strings.HasSuffix(line, ";") && f[1] == ".align" && f[3] == ".b8"
			if ok {
				var sz string
				align, _ = strconv.Atoi(f[2])
				name, sz, ok = strings.Cut(f[4], "[")
				size, _ = strconv.Atoi(strings.TrimSuffix(sz, "]"))
				ok = ok && strings.HasSuffix(sz, "]") && name != "" && size > 0 && align > 0 && align <= 16 && align&(align-1) == 0
			}
			if !ok {
				return fail("bad shared array (want .shared .align N .b8 name[size];)")
			}
			if _, dup := k.shared[name]; dup {
				return fail("shared array %s declared twice", name)
			}
			off := (k.sharedSize + align - 1) &^ (align - 1)
			k.shared[name] = ptxSharedBase + uint64(off)
			k.sharedSize = off + size
			continue
		case line == "{":
			inBody = true
			continue
		case line == "}":
			inBody = false
			continue
		case strings.HasPrefix(line, ".reg "):
			f := strings.Fields(strings.TrimSuffix(line, ";"))
			widths := map[string]uint{".pred": 1, ".b16": 16, ".u16": 16, ".b32": 32, ".u32": 32, ".s32": 32, ".f32": 32, ".b64": 64, ".u64": 64, ".s64": 64}
			if len(f) != 3 || !strings.HasSuffix(line, ";") || !strings.HasPrefix(f[2], "%") || widths[f[1]] == 0 {
				return fail("bad register declaration")
			}
			name, count, ok := strings.Cut(f[2], "<")
			names := []string{name}
			if ok {
				c, err := strconv.Atoi(strings.TrimSuffix(count, ">"))
				if err != nil || c <= 0 {
					return fail("bad register count")
				}
				names = names[:0]
				for i := range c {
					names = append(names, name+strconv.Itoa(i))
				}
			}
			for _, r := range names {
				if _, dup := k.regIdx[r]; dup {
					return fail("register %s declared twice", r)
				}
				k.regIdx[r] = len(k.regName)
				k.regName = append(k.regName, r)
				k.regWidth = append(k.regWidth, widths[f[1]])
				k.regKind = append(k.regKind, f[1][1])
			}
			continue
		}
		if !inBody {
			return fail("instruction outside the kernel body")
		}
		if label, rest, ok := strings.Cut(line, ":"); ok && !strings.ContainsAny(label, " \t[.") {
			if _, dup := k.labels[label]; dup {
				return fail("label defined twice")
			}
			k.labels[label] = len(k.insts)
			line = strings.TrimSpace(rest)
			if line == "" {
				continue
			}
		}
		if !strings.HasSuffix(line, ";") {
			return fail("instruction without ';'")
		}
		line = strings.TrimSuffix(line, ";")
		in := ptxInst{line: n + 1, guard: -1}
		if strings.HasPrefix(line, "@") {
			g, rest, _ := strings.Cut(line, " ")
			g = strings.TrimPrefix(g, "@")
			if strings.HasPrefix(g, "!") {
				in.negate, g = true, g[1:]
			}
			r, ok := k.regIdx[g]
			if !ok || k.regWidth[r] != 1 {
				return fail("guard %s is not a declared predicate", g)
			}
			in.guard = r
			line = strings.TrimSpace(rest)
		}
		opText := strings.Fields(line)[0]
		argText := strings.TrimSpace(strings.TrimPrefix(line, opText))
		in.op = opText
		if err := k.decode(&in, argText); err != nil {
			return fail("%v", err)
		}
		if in.code == cBra {
			branches = append(branches, pending{n + 1, argText})
		}
		k.insts = append(k.insts, in)
	}
	bi := 0
	for i := range k.insts {
		if k.insts[i].code != cBra {
			continue
		}
		b := branches[bi]
		bi++
		target, ok := k.labels[b.target]
		if !ok {
			return nil, fmt.Errorf("%s:%d: branch to undefined label %s", file, b.line, b.target)
		}
		k.insts[i].target = target
	}
	if k.name == "" || len(k.insts) == 0 {
		return nil, fmt.Errorf("%s: no kernel found", file)
	}
	if last := k.insts[len(k.insts)-1]; last.code != cRet && !(last.code == cBra && last.guard < 0) {
		return nil, fmt.Errorf("%s:%d: the kernel can run past its last instruction", file, last.line)
	}
	k.counts = make([]int, len(k.insts))
	return k, nil
}

// ptxType splits a PTX type suffix ("u64") into its letter and width.
func ptxType(s string) (kind byte, width uint, ok bool) {
	if len(s) < 2 {
		return 0, 0, false
	}
	w, err := strconv.Atoi(s[1:])
	if err != nil || (w != 8 && w != 16 && w != 32 && w != 64) {
		return 0, 0, false
	}
	switch s[0] {
	case 'u', 's', 'b':
		return s[0], uint(w), true
	}
	return 0, 0, false
}

// Operand roles, for decode's checks.
const (
	roleDst     = iota // a register written, of exactly the width
	roleSrc            // a register or immediate read, of exactly the width
	roleReg            // a register read, of exactly the width (no immediate)
	rolePred           // a predicate register read
	roleDstPred        // a predicate register written
)

// decode fills in.code and in.args from the opcode and operand text,
// checking the opcode against the PTX ISA and the operands against it.
func (k *ptxKernel) decode(in *ptxInst, argText string) error {
	parts := strings.Split(in.op, ".")
	args := splitArgs(argText)
	want := func(n int) error {
		if len(args) != n {
			return fmt.Errorf("%s takes %d operands, got %d", in.op, n, len(args))
		}
		return nil
	}
	typed := func(s string, kinds string) error {
		kind, w, ok := ptxType(s)
		if !ok || !strings.ContainsRune(kinds, rune(kind)) {
			return fmt.Errorf("%s: type .%s is not one of .%s types", in.op, s, strings.Join(strings.Split(kinds, ""), "/."))
		}
		in.width, in.signed = w, kind == 's'
		return nil
	}
	// typedOp sets in.code to code, checks that the opcode has n parts
	// (hint shows their form in the error), and that part t is a type of
	// kinds, which sets the instruction's width and signedness.
	typedOp := func(code ptxCode, n int, hint string, t int, kinds string) error {
		in.code = code
		if len(parts) != n {
			return fmt.Errorf("unknown %s%s", in.op, hint)
		}
		return typed(parts[t], kinds)
	}
	// operands checks args against roles and widths (0: the instruction's).
	operands := func(roles []int, widths []uint) error {
		if err := want(len(roles)); err != nil {
			return err
		}
		for i, a := range args {
			w := widths[i]
			if w == 0 {
				w = in.width
			}
			op, err := k.operand(a, roles[i], w, i == len(args)-1)
			if err != nil {
				return fmt.Errorf("operand %d (%s) of %s: %w", i+1, a, in.op, err)
			}
			in.args = append(in.args, op)
		}
		return nil
	}
	if ok, err := k.decodeF8(in, args); ok {
		return err
	}
	switch parts[0] {
	case "ret":
		in.code = cRet
		if len(parts) != 1 || argText != "" {
			return fmt.Errorf("bad ret")
		}
		return nil
	case "bra":
		in.code = cBra
		if len(parts) > 2 || (len(parts) == 2 && parts[1] != "uni") {
			return fmt.Errorf("unknown %s", in.op)
		}
		if len(parts) == 2 && in.guard >= 0 {
			return fmt.Errorf("bra.uni under a predicate may diverge: use bra")
		}
		if len(args) != 1 || strings.ContainsAny(argText, " %[") {
			return fmt.Errorf("bra takes one label")
		}
		return nil
	case "mov":
		if strings.Contains(argText, "{") {
			// mov.b64 d, {lo, hi} and mov.b64 {lo, hi}, a: a 64-bit
			// register as two 32-bit halves, the low one first; mov.b32
			// the same with a 32-bit register and 16-bit halves.
			if in.op != "mov.b64" && in.op != "mov.b32" {
				return fmt.Errorf("%s: only mov.b64 and mov.b32 move a {vector}", in.op)
			}
			if err := want(2); err != nil {
				return err
			}
			in.width = 64
			if in.op == "mov.b32" {
				in.width = 32
			}
			at, role, code := 1, roleDst, cPack
			if strings.HasPrefix(args[0], "{") {
				at, role, code = 0, roleReg, cUnpack
			}
			v, err := k.vector(args[at], in.width/2, 2)
			if err != nil {
				return fmt.Errorf("%s: %w", in.op, err)
			}
			r, err := k.operand(args[1-at], role, in.width, false)
			if err != nil {
				return fmt.Errorf("%s: %w", in.op, err)
			}
			in.code, in.args = code, []ptxArg{r, v}
			if code == cUnpack {
				in.args = []ptxArg{v, r}
			}
			return nil
		}
		if err := typedOp(cMov, 2, "", 1, "usb"); err != nil {
			return err
		}
		if a, ok := k.shared[strings.TrimSpace(argText[strings.LastIndex(argText, ",")+1:])]; ok && len(args) == 2 {
			// mov.u32 d, name: the address of a shared array.
			if in.width != 32 {
				return fmt.Errorf("%s: the address of shared array %s is 32-bit: use mov.u32", in.op, args[1])
			}
			d, err := k.operand(args[0], roleDst, 32, false)
			if err != nil {
				return err
			}
			in.args = []ptxArg{d, {kind: argImm, imm: a, text: args[1]}}
			return nil
		}
		return operands([]int{roleDst, roleSrc}, []uint{0, 0})
	case "shfl":
		// shfl.sync.bfly.b32 d, a, b, c, membermask: each lane of the warp
		// takes a from lane ^ b (see ptxKernel.shfl).
		if in.op != "shfl.sync.bfly.b32" {
			return fmt.Errorf("%s: the interpreter knows shfl.sync.bfly.b32 only", in.op)
		}
		if in.guard >= 0 {
			return fmt.Errorf("%s under a predicate may leave lanes out of the shuffle", in.op)
		}
		in.code, in.width = cShfl, 32
		if err := want(5); err != nil {
			return err
		}
		d, err := k.operand(args[0], roleDst, 32, false)
		if err != nil {
			return fmt.Errorf("operand 1 of %s: %w", in.op, err)
		}
		a, err := k.operand(args[1], roleReg, 32, false)
		if err != nil {
			return fmt.Errorf("operand 2 of %s: %w", in.op, err)
		}
		b, err := k.operand(args[2], roleSrc, 32, true)
		if err != nil {
			return fmt.Errorf("operand 3 of %s: %w", in.op, err)
		}
		c, err := parseImm(args[3], 32)
		if err != nil {
			return fmt.Errorf("operand 4 of %s (an immediate clamp): %w", in.op, err)
		}
		if m, err := parseImm(args[4], 32); err != nil || m != 0xffffffff {
			return fmt.Errorf("%s: the interpreter knows full-warp shuffles only (membermask 0xffffffff)", in.op)
		}
		in.args = []ptxArg{d, a, b, {kind: argImm, imm: c, text: args[3]}}
		return nil
	case "bar":
		if in.op != "bar.sync" || argText != "0" {
			return fmt.Errorf("%s %s: the interpreter knows bar.sync 0 only", in.op, argText)
		}
		if in.guard >= 0 {
			return fmt.Errorf("bar.sync under a predicate may leave threads out of the barrier")
		}
		in.code = cBar
		return nil
	case "cvta":
		// cvta.to.global.u64: global addresses are generic ones here.
		if in.op != "cvta.to.global.u64" {
			return fmt.Errorf("unknown %s", in.op)
		}
		in.code, in.width = cMov, 64
		return operands([]int{roleDst, roleReg}, []uint{64, 64})
	case "cvt":
		if err := typedOp(cCvt, 3, " (cvt.dtype.stype)", 2, "us"); err != nil {
			return err
		}
		in.srcW = in.width
		_, dw, ok := ptxType(parts[1])
		if !ok || (parts[1][0] != 'u' && parts[1][0] != 's') {
			return fmt.Errorf("%s: bad destination type", in.op)
		}
		in.width = dw
		return operands([]int{roleDst, roleReg}, []uint{max(dw, 16), max(in.srcW, 16)})
	case "setp":
		in.code = cSetp
		if len(parts) != 3 {
			return fmt.Errorf("unknown %s (setp.cmp.type)", in.op)
		}
		in.sub = parts[1]
		kinds := "us"
		switch in.sub {
		case "eq", "ne":
			kinds = "usb"
		case "lt", "le", "gt", "ge":
		default:
			return fmt.Errorf("%s: unknown comparison %s", in.op, in.sub)
		}
		if err := typed(parts[2], kinds); err != nil {
			return err
		}
		return operands([]int{roleDstPred, roleReg, roleSrc}, []uint{1, 0, 0})
	case "selp":
		if err := typedOp(cSelp, 2, "", 1, "usb"); err != nil {
			return err
		}
		if err := want(4); err != nil {
			return err
		}
		for i, role := range []int{roleDst, roleSrc, roleSrc, rolePred} {
			w := in.width
			if role == rolePred {
				w = 1
			}
			op, err := k.operand(args[i], role, w, role == roleSrc)
			if err != nil {
				return fmt.Errorf("operand %d (%s) of %s: %w", i+1, args[i], in.op, err)
			}
			in.args = append(in.args, op)
		}
		return nil
	case "mad":
		// mad.wide.u32 d, a, b, c: d = a·b + c, a and b 32-bit, d and c
		// 64-bit.
		if in.op != "mad.wide.u32" {
			return fmt.Errorf("%s: the interpreter knows mad.wide.u32 only", in.op)
		}
		in.code, in.width, in.sub = cMulWide, 32, "mad"
		return operands([]int{roleDst, roleReg, roleReg, roleSrc}, []uint{64, 32, 32, 64})
	case "add", "sub", "min", "max", "and", "or", "xor", "shl", "shr", "mul":
		if in.op == "add.rn.f32" || in.op == "mul.rn.f32" {
			return k.decodeF32(in, parts[0], operands)
		}
		in.code, in.sub = cBin, parts[0]
		typ, kinds := parts[len(parts)-1], "us"
		switch {
		case parts[0] == "mul" && len(parts) == 3 && parts[1] == "lo":
		case parts[0] == "mul" && len(parts) == 3 && parts[1] == "wide":
			if typ != "u32" {
				return fmt.Errorf("%s: the interpreter knows mul.wide.u32 only", in.op)
			}
			in.code, in.width = cMulWide, 32
			return operands([]int{roleDst, roleReg, roleSrc}, []uint{64, 32, 32})
		case parts[0] == "mul":
			return fmt.Errorf("%s: want mul.lo or mul.wide", in.op)
		case len(parts) != 2:
			return fmt.Errorf("unknown %s", in.op)
		case parts[0] == "and" || parts[0] == "or" || parts[0] == "xor" || parts[0] == "shl":
			kinds = "b"
		case parts[0] == "shr":
			kinds = "usb"
		}
		if err := typed(typ, kinds); err != nil {
			return err
		}
		if in.width < 16 {
			return fmt.Errorf("%s: no 8-bit arithmetic in PTX", in.op)
		}
		third := uint(0)
		if parts[0] == "shl" || parts[0] == "shr" {
			third = 32 // the shift amount is .u32
		}
		return operands([]int{roleDst, roleReg, roleSrc}, []uint{0, 0, third})
	case "div", "rem":
		if in.op == "div.rn.f32" {
			return k.decodeF32(in, "div", operands)
		}
		if in.op != "div.u32" && in.op != "rem.u32" {
			return fmt.Errorf("%s: the interpreter knows div.u32, rem.u32 and div.rn.f32 only", in.op)
		}
		in.code, in.sub, in.width = cDiv, parts[0], 32
		return operands([]int{roleDst, roleReg, roleSrc}, []uint{32, 32, 32})
	case "shf":
		// shf.r.wrap.b32 d, a, b, c: the 64 bits b:a shifted by c.
		in.code, in.width = cShf, 32
		if len(parts) != 4 || (parts[1] != "l" && parts[1] != "r") || (parts[2] != "wrap" && parts[2] != "clamp") || parts[3] != "b32" {
			return fmt.Errorf("unknown %s (shf.l/r.wrap/clamp.b32)", in.op)
		}
		in.sub = parts[1] + "." + parts[2]
		return operands([]int{roleDst, roleReg, roleReg, roleSrc}, []uint{32, 32, 32, 32})
	case "prmt":
		// prmt.b32 d, a, b, c: four bytes of b:a picked by c's nibbles.
		in.code, in.width = cPrmt, 32
		if in.op != "prmt.b32" {
			return fmt.Errorf("%s: the interpreter knows prmt.b32 (the generic form) only", in.op)
		}
		return operands([]int{roleDst, roleReg, roleReg, roleSrc}, []uint{32, 32, 32, 32})
	case "clz":
		in.code = cClz
		if in.op != "clz.b32" {
			return fmt.Errorf("%s: the interpreter knows clz.b32 only", in.op)
		}
		in.width = 32
		return operands([]int{roleDst, roleReg}, []uint{32, 32})
	case "ld", "st":
		in.code = cLd
		if parts[0] == "st" {
			in.code = cSt
		}
		if len(parts) < 3 {
			return fmt.Errorf("unknown %s", in.op)
		}
		if err := typed(parts[len(parts)-1], "usb"); err != nil {
			return err
		}
		if in.signed {
			return fmt.Errorf("%s: the interpreter does not sign-extend loads", in.op)
		}
		quals := parts[2 : len(parts)-1]
		in.vec = 1
		if n := len(quals); n > 0 && (quals[n-1] == "v2" || quals[n-1] == "v4") {
			in.vec = int(quals[n-1][1] - '0')
			quals = quals[:n-1]
			if uint(in.vec)*in.width > 128 {
				return fmt.Errorf("%s: vectors hold at most 128 bits", in.op)
			}
		}
		if err := cacheQualifiers(parts[0], parts[1], quals); err != nil {
			return fmt.Errorf("%s: %w", in.op, err)
		}
		if err := want(2); err != nil {
			return err
		}
		val, addr := args[0], args[1]
		if in.code == cSt {
			val, addr = args[1], args[0]
		}
		switch parts[1] {
		case "param":
			if in.code != cLd || in.vec != 1 {
				return fmt.Errorf("%s: only scalar loads of parameters", in.op)
			}
			in.code = cLdParam
			p := -1
			for i, name := range k.params {
				if "["+name+"]" == addr {
					p = i
				}
			}
			if p < 0 {
				return fmt.Errorf("%s: %s is no parameter", in.op, addr)
			}
			if uint(k.paramSize[p])*8 != in.width {
				return fmt.Errorf("%s of the %d-byte parameter %s", in.op, k.paramSize[p], addr)
			}
			d, err := k.operand(val, roleDst, in.width, false)
			if err != nil {
				return err
			}
			in.args = []ptxArg{d, {kind: argParam, reg: p, text: addr}}
			return nil
		case "global":
		case "shared":
			in.shared = true
		default:
			return fmt.Errorf("%s: only .param, .global and .shared", in.op)
		}
		aw := uint(64)
		if in.shared {
			aw = 32 // shared addresses are 32-bit (mov.u32 of the array's name)
		}
		a, err := k.address(addr, aw)
		if err != nil {
			return err
		}
		var v ptxArg
		if in.vec == 1 {
			role := roleDst
			if in.code == cSt {
				role = roleReg
			}
			// A register wider than an 8- or 16-bit type may be used:
			// loads zero-extend into it, stores take its low bits.
			r, ok := k.regIdx[val]
			if !ok {
				return fmt.Errorf("%s: %s is no declared register", in.op, val)
			}
			w := in.width
			if w < 32 && k.regWidth[r] > w {
				w = k.regWidth[r]
			}
			if v, err = k.operand(val, role, max(w, 16), false); err != nil {
				return fmt.Errorf("%s: %w", in.op, err)
			}
		} else {
			if v, err = k.vector(val, in.width, in.vec); err != nil {
				return fmt.Errorf("%s: %w", in.op, err)
			}
		}
		if in.code == cSt {
			in.args = []ptxArg{a, v}
		} else {
			in.args = []ptxArg{v, a}
		}
		return nil
	case "membar":
		if in.op != "membar.gl" || argText != "" {
			return fmt.Errorf("%s %s: the interpreter knows membar.gl only", in.op, argText)
		}
		in.code = cMembar
		return nil
	case "atom":
		switch in.op {
		case "atom.global.add.u32":
			in.code, in.sub, in.width = cAtom, "add", 32
		case "atom.global.exch.b64":
			in.code, in.sub, in.width = cAtom, "exch", 64
		case "atom.global.max.u64":
			in.code, in.sub, in.width = cAtom, "max", 64
		default:
			return fmt.Errorf("%s: the interpreter knows atom.global.add.u32, atom.global.exch.b64 and atom.global.max.u64 only", in.op)
		}
		if err := want(3); err != nil {
			return err
		}
		d, err := k.operand(args[0], roleDst, in.width, false)
		if err != nil {
			return err
		}
		a, err := k.address(args[1], 64)
		if err != nil {
			return err
		}
		v, err := k.operand(args[2], roleSrc, in.width, true)
		if err != nil {
			return err
		}
		in.args = []ptxArg{d, a, v}
		return nil
	case "red":
		if in.op != "red.global.add.u64" {
			return fmt.Errorf("%s: the interpreter knows red.global.add.u64 only", in.op)
		}
		in.code, in.width = cRed, 64
		if err := want(2); err != nil {
			return err
		}
		a, err := k.address(args[0], 64)
		if err != nil {
			return err
		}
		v, err := k.operand(args[1], roleReg, 64, false)
		if err != nil {
			return err
		}
		in.args = []ptxArg{a, v}
		return nil
	}
	return fmt.Errorf("the interpreter does not know %s", in.op)
}

// decodeF32 decodes div.rn.f32, mul.rn.f32 or add.rn.f32 (sub says
// which): IEEE arithmetic rounded to nearest even, subnormals kept. Its
// operands are registers of a type that ptxas takes for .f32: declared
// .f32 or .b32 (an integer register is a type mismatch), and no
// immediates (PTX writes float constants as 0fXXXXXXXX, which the
// interpreter does not parse: move the bits into a .b32 register first).
func (k *ptxKernel) decodeF32(in *ptxInst, sub string, operands func([]int, []uint) error) error {
	in.code, in.sub, in.width = cDivF32, sub, 32
	if err := operands([]int{roleDst, roleReg, roleReg}, []uint{32, 32, 32}); err != nil {
		return err
	}
	for i, a := range in.args {
		if kind := k.regKind[a.reg]; kind != 'f' && kind != 'b' {
			return fmt.Errorf("operand %d (%s) of %s: a .%c32 register; .f32 operands need .f32 or .b32 registers", i+1, a.text, in.op, kind)
		}
	}
	return nil
}

// operand parses a register or immediate operand of the given role and
// width; last says whether it is the last operand (where immediates go).
func (k *ptxKernel) operand(a string, role int, width uint, last bool) (ptxArg, error) {
	if strings.HasPrefix(a, "%") {
		r, ok := k.regIdx[a]
		if !ok {
			return ptxArg{}, fmt.Errorf("undeclared register %s", a)
		}
		if (role == roleDst || role == roleDstPred) && r < ptxSpecials {
			return ptxArg{}, fmt.Errorf("%s is read-only", a)
		}
		if k.regWidth[r] != width {
			return ptxArg{}, fmt.Errorf("%s is a %d-bit register, the operand is %d-bit", a, k.regWidth[r], width)
		}
		return ptxArg{kind: argReg, reg: r, text: a}, nil
	}
	if role != roleSrc || !last {
		return ptxArg{}, fmt.Errorf("want a register")
	}
	v, err := parseImm(a, width)
	return ptxArg{kind: argImm, imm: v, text: a}, err
}

// parseImm parses a decimal (maybe negative) or 0x hexadecimal integer
// that must fit width bits, signed or unsigned, and truncates it to them.
func parseImm(a string, width uint) (uint64, error) {
	var v uint64
	var err error
	switch {
	case strings.HasPrefix(a, "0x"):
		v, err = strconv.ParseUint(a[2:], 16, 64)
	case strings.HasPrefix(a, "-"):
		var s int64
		s, err = strconv.ParseInt(a, 10, 64)
		if err == nil && width < 64 && s < -(1<<(width-1)) {
			err = fmt.Errorf("%s does not fit %d bits", a, width)
		}
		v = uint64(s)
		if width < 64 {
			v &= 1<<width - 1
		}
		return v, err
	default:
		v, err = strconv.ParseUint(a, 10, 64)
	}
	if err == nil && width < 64 && v >= 1<<width {
		err = fmt.Errorf("%s does not fit %d bits", a, width)
	}
	return v, err
}

// vector parses a {vector} of n declared registers of width bits.
func (k *ptxKernel) vector(text string, width uint, n int) (ptxArg, error) {
	if !strings.HasPrefix(text, "{") || !strings.HasSuffix(text, "}") {
		return ptxArg{}, fmt.Errorf("want a {vector} of registers, got %s", text)
	}
	v := ptxArg{kind: argVec, text: text}
	for _, r := range strings.Split(strings.Trim(text, "{}"), ",") {
		r = strings.TrimSpace(r)
		i, ok := k.regIdx[r]
		if !ok || k.regWidth[i] != width || i < ptxSpecials {
			return ptxArg{}, fmt.Errorf("%s is no declared %d-bit register", r, width)
		}
		v.vec = append(v.vec, i)
	}
	if len(v.vec) != n {
		return ptxArg{}, fmt.Errorf("want %d registers, got %d", n, len(v.vec))
	}
	return v, nil
}

// cacheQualifiers checks the qualifiers between a load's or store's state
// space and its vector and type (op is "ld" or "st") against the forms of
// the PTX ISA the interpreter knows: ld.global{.nc}{.L1::eviction}{.L2::
// prefetch size} and st.global{.cop or .L1::eviction}. They change no
// result, only what the caches keep.
func cacheQualifiers(op, space string, quals []string) error {
	if len(quals) == 0 {
		return nil
	}
	if space != "global" {
		return fmt.Errorf("no cache qualifiers on .%s", space)
	}
	l1 := []string{"L1::no_allocate", "L1::evict_first", "L1::evict_last", "L1::evict_normal"}
	order := [][]string{{"nc"}, l1, {"L2::64B", "L2::128B", "L2::256B"}}
	if op == "st" {
		order = [][]string{append([]string{"cs", "cg", "wb", "wt"}, l1...)}
	}
	i := 0
	for _, q := range quals {
		for i < len(order) && !slices.Contains(order[i], q) {
			i++
		}
		if i == len(order) {
			return fmt.Errorf("qualifier .%s unknown here or out of order", q)
		}
		i++
	}
	return nil
}

// address parses [%rN] or [%rN+imm], %rN a register of width bits.
func (k *ptxKernel) address(a string, width uint) (ptxArg, error) {
	if !strings.HasPrefix(a, "[") || !strings.HasSuffix(a, "]") {
		return ptxArg{}, fmt.Errorf("want an [address], got %s", a)
	}
	reg, off, _ := strings.Cut(strings.Trim(a, "[]"), "+")
	r, ok := k.regIdx[reg]
	if !ok || k.regWidth[r] != width {
		return ptxArg{}, fmt.Errorf("address register %s is no declared %d-bit register", reg, width)
	}
	op := ptxArg{kind: argMem, reg: r, text: a}
	if off != "" {
		v, err := strconv.ParseUint(off, 10, 32)
		if err != nil {
			return op, fmt.Errorf("bad address offset %s", off)
		}
		op.imm = v
	}
	return op, nil
}

// splitArgs splits on commas outside braces.
func splitArgs(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '{':
			depth++
		case '}':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if rest := strings.TrimSpace(s[start:]); rest != "" {
		out = append(out, rest)
	}
	return out
}

// ptxMemory is a flat simulated address space of a few regions.
type ptxMemory struct {
	regions []ptxRegion
}

type ptxRegion struct {
	base     uint64
	data     []byte
	readOnly bool
	name     string
}

// add maps b at base, writable.
func (m *ptxMemory) add(base uint64, b []byte) { m.addRegion(base, b, false, "") }

// addRegion maps b at base; a read-only region refuses stores.
func (m *ptxMemory) addRegion(base uint64, b []byte, readOnly bool, name string) {
	m.regions = append(m.regions, ptxRegion{base: base, data: b, readOnly: readOnly, name: name})
}

// at returns the n bytes at addr, checking alignment, bounds and, for
// writes, that the region is writable.
func (m *ptxMemory) at(addr uint64, n int, write bool) ([]byte, error) {
	if addr%uint64(n) != 0 {
		return nil, fmt.Errorf("misaligned %d-byte access at %#x", n, addr)
	}
	for _, r := range m.regions {
		if addr >= r.base && addr+uint64(n) <= r.base+uint64(len(r.data)) {
			if write && r.readOnly {
				return nil, fmt.Errorf("write of %d bytes at %#x into the read-only %s", n, addr, r.name)
			}
			return r.data[addr-r.base : addr-r.base+uint64(n)], nil
		}
	}
	return nil, fmt.Errorf("illegal address %#x (%d bytes): outside every region", addr, n)
}

// ptxSharedBase is the address of a block's shared memory: its arrays lie
// from there, in the order they are declared.
const ptxSharedBase = 0x1000

// ptxLimit bounds the instructions one thread may run.
const ptxLimit = 50_000_000

// run executes the kernel over a grid of blocks×threads with the given
// parameter values (in declaration order).
func (k *ptxKernel) run(mem *ptxMemory, blocks, threads int, params ...uint64) error {
	return k.runBlocks(mem, blocks, threads, nil, params...)
}

// runBlocks executes only the blocks listed in which (all of them when
// which is nil) of a grid of blocks×threads: the kernels' blocks are
// independent, so a test may run a few of a large grid.
func (k *ptxKernel) runBlocks(mem *ptxMemory, blocks, threads int, which []int, params ...uint64) error {
	if len(params) != len(k.params) {
		return fmt.Errorf("%d parameters for %d", len(params), len(k.params))
	}
	for i, p := range params {
		if k.paramSize[i] == 4 && p >= 1<<32 {
			return fmt.Errorf("parameter %s = %d does not fit 32 bits", k.params[i], p)
		}
	}
	if k.maxntid > 0 && threads > k.maxntid {
		return fmt.Errorf("%s: blocks of %d threads, past the kernel's .maxntid %d (the launch would fail)", k.file, threads, k.maxntid)
	}
	if which == nil {
		which = make([]int, blocks)
		for b := range which {
			which[b] = b
		}
	}
	ths := make([]ptxThread, threads)
	for i := range ths {
		ths[i].regs, ths[i].set = make([]uint64, len(k.regName)), make([]bool, len(k.regName))
	}
	for _, b := range which {
		if b < 0 || b >= blocks {
			return fmt.Errorf("%s: block %d of a grid of %d", k.file, b, blocks)
		}
		if err := k.runBlock(mem, b, blocks, ths, params); err != nil {
			return fmt.Errorf("%s: block %d %w", k.file, b, err)
		}
	}
	return nil
}

// executed returns how often instructions with opcode op ran, over every
// run so far.
func (k *ptxKernel) executed(op string) int {
	n := 0
	for i, in := range k.insts {
		if in.op == op {
			n += k.counts[i]
		}
	}
	return n
}

// resetCounts forgets the execution counts.
func (k *ptxKernel) resetCounts() { clear(k.counts) }

func mask(v uint64, w uint) uint64 {
	if w >= 64 {
		return v
	}
	return v & (1<<w - 1)
}

func sext(v uint64, w uint) int64 {
	return int64(v<<(64-w)) >> (64 - w)
}

// ptxThread is one thread of a block: its registers and the instruction
// it stands at.
type ptxThread struct {
	regs  []uint64
	set   []bool // which registers were written
	pc    int
	steps int
	done  bool // it returned
}

// runBlock executes block b of a grid of blocks, one thread of ths per
// thread of the block. Each thread runs on its own until it returns or
// reaches a collective instruction (shfl.sync, bar.sync), where it waits;
// once no thread can go on alone, the block executes the collectives its
// threads wait at (collective), and they go on.
func (k *ptxKernel) runBlock(mem *ptxMemory, b, blocks int, ths []ptxThread, params []uint64) error {
	for i := range ths {
		th := &ths[i]
		clear(th.set)
		th.pc, th.steps, th.done = 0, 0, false
		th.regs[ptxTid], th.regs[ptxNtid], th.regs[ptxCtaid], th.regs[ptxNctaid] = uint64(i), uint64(len(ths)), uint64(b), uint64(blocks)
		th.set[ptxTid], th.set[ptxNtid], th.set[ptxCtaid], th.set[ptxNctaid] = true, true, true, true
	}
	sh := &ptxShared{data: make([]byte, k.sharedSize), written: make([]bool, k.sharedSize)}
	for {
		live := 0
		for i := range ths {
			th := &ths[i]
			if th.done {
				continue
			}
			if err := k.runThread(th, mem, sh, params); err != nil {
				return fmt.Errorf("thread %d: %w", i, err)
			}
			if !th.done {
				live++
			}
		}
		if live == 0 {
			return nil
		}
		if err := k.collective(ths); err != nil {
			return err
		}
	}
}

// collective executes the collective instructions that the live threads
// of a block wait at: a warp's shfl.sync once all 32 of its lanes wait at
// it, else a bar.sync once every thread of the block waits at it. It fails
// where that can never happen, as the GPU would hang or give undefined
// results: a warp's lanes at different instructions or exited, a partial
// warp, a barrier some threads exited before or wait at elsewhere.
func (k *ptxKernel) collective(ths []ptxThread) error {
	shuffled := false
	for w := 0; w*32 < len(ths); w++ {
		lanes := ths[w*32 : min(len(ths), w*32+32)]
		at := -1 // a lane waiting at a shfl.sync
		for i := range lanes {
			if !lanes[i].done && k.insts[lanes[i].pc].code == cShfl {
				at = i
				break
			}
		}
		if at < 0 {
			continue
		}
		pc := lanes[at].pc
		in := &k.insts[pc]
		fail := func(format string, a ...any) error {
			return fmt.Errorf("line %d (%s): %s", in.line, in.op, fmt.Sprintf(format, a...))
		}
		if len(lanes) != 32 {
			return fail("a warp of %d threads: a full-warp shuffle needs 32", len(lanes))
		}
		for i := range lanes {
			switch l := &lanes[i]; {
			case l.done:
				return fail("lane %d of warp %d has exited", i, w)
			case l.pc != pc:
				return fail("lane %d of warp %d waits at line %d: the warp diverged", i, w, k.insts[l.pc].line)
			}
		}
		if err := k.shfl(in, lanes); err != nil {
			return fail("%v", err)
		}
		k.counts[pc] += len(lanes)
		shuffled = true
	}
	if shuffled {
		return nil
	}
	at, exited := -1, 0
	for i := range ths {
		switch {
		case ths[i].done:
			exited++
		case at < 0:
			at = i
		case ths[i].pc != ths[at].pc:
			return fmt.Errorf("thread %d waits at line %d, thread %d at line %d: every thread must reach the same bar.sync", at, k.insts[ths[at].pc].line, i, k.insts[ths[i].pc].line)
		}
	}
	pc := ths[at].pc
	if exited > 0 {
		return fmt.Errorf("line %d (bar.sync): %d threads of the block exited before the barrier", k.insts[pc].line, exited)
	}
	for i := range ths {
		ths[i].pc++
	}
	k.counts[pc] += len(ths)
	return nil
}

// shfl executes shfl.sync.bfly.b32 d, a, b, c for the 32 lanes of a warp,
// as the PTX ISA defines it: lane i takes a of lane i ^ b, or its own a
// where that lane lies past the clamp c names.
func (k *ptxKernel) shfl(in *ptxInst, lanes []ptxThread) error {
	var a, d [32]uint64
	for i := range lanes {
		r := in.args[1].reg
		if !lanes[i].set[r] {
			return fmt.Errorf("lane %d reads %s before it is written", i, in.args[1].text)
		}
		a[i] = lanes[i].regs[r]
	}
	c := in.args[3].imm
	cval, segmask := c&31, c>>8&31
	for i := range lanes {
		b := in.args[2].imm
		if in.args[2].kind == argReg {
			if !lanes[i].set[in.args[2].reg] {
				return fmt.Errorf("lane %d reads %s before it is written", i, in.args[2].text)
			}
			b = lanes[i].regs[in.args[2].reg]
		}
		maxLane := uint64(i)&segmask | cval&^segmask
		j := uint64(i) ^ b&31
		if j > maxLane {
			j = uint64(i)
		}
		d[i] = a[j]
	}
	for i := range lanes {
		r := in.args[0].reg
		lanes[i].regs[r], lanes[i].set[r] = d[i], true
		lanes[i].pc++
	}
	return nil
}

// ptxShared is a block's shared memory, and which of its bytes a thread of
// the block wrote: the kernel must not read any other.
type ptxShared struct {
	data    []byte
	written []bool
}

// at returns the n bytes of shared memory at addr, checking alignment,
// bounds and, for reads, that they were written.
func (s *ptxShared) at(addr uint64, n int, write bool) ([]byte, error) {
	if addr%uint64(n) != 0 {
		return nil, fmt.Errorf("misaligned %d-byte shared access at %#x", n, addr)
	}
	off := addr - ptxSharedBase
	if addr < ptxSharedBase || off+uint64(n) > uint64(len(s.data)) {
		return nil, fmt.Errorf("shared address %#x (%d bytes) outside the block's %d bytes", addr, n, len(s.data))
	}
	for i := off; i < off+uint64(n); i++ {
		if write {
			s.written[i] = true
		} else if !s.written[i] {
			return nil, fmt.Errorf("reads shared memory at %#x before a thread of the block wrote it", addr)
		}
	}
	return s.data[off : off+uint64(n)], nil
}

// runThread executes th from where it stands until it returns or reaches a
// collective instruction, which it leaves to the block (th.pc stays on it).
func (k *ptxKernel) runThread(th *ptxThread, mem *ptxMemory, sh *ptxShared, params []uint64) error {
	regs, set := th.regs, th.set
	var in *ptxInst
	get := func(a *ptxArg) (uint64, error) {
		if a.kind == argImm {
			return a.imm, nil
		}
		if !set[a.reg] {
			return 0, fmt.Errorf("reads %s before it is written", a.text)
		}
		return regs[a.reg], nil
	}
	// get2 returns the values of the instruction's operands 1 and 2.
	get2 := func() (a, b uint64, err error) {
		if a, err = get(&in.args[1]); err != nil {
			return 0, 0, err
		}
		b, err = get(&in.args[2])
		return a, b, err
	}
	put := func(a *ptxArg, v uint64) {
		regs[a.reg] = mask(v, k.regWidth[a.reg])
		set[a.reg] = true
	}
	addr := func(a *ptxArg) (uint64, error) {
		if !set[a.reg] {
			return 0, fmt.Errorf("address register %s read before it is written", k.regName[a.reg])
		}
		return mask(regs[a.reg]+a.imm, k.regWidth[a.reg]), nil
	}
	for ; ; th.steps++ {
		pc := th.pc
		if pc >= len(k.insts) {
			return fmt.Errorf("ran off the end of the kernel")
		}
		if th.steps > ptxLimit {
			return fmt.Errorf("no ret after %d instructions", th.steps)
		}
		in = &k.insts[pc]
		if in.code == cShfl || in.code == cBar {
			return nil
		}
		k.counts[pc]++
		th.pc++
		if in.guard >= 0 {
			if !set[in.guard] {
				return fmt.Errorf("line %d: predicate %s read before it is written", in.line, k.regName[in.guard])
			}
			if (regs[in.guard] != 0) == in.negate {
				continue
			}
		}
		err := func() error {
			switch in.code {
			case cRet:
				return errRet
			case cBra:
				th.pc = in.target
			case cLdParam:
				put(&in.args[0], params[in.args[1].reg])
			case cMov:
				v, err := get(&in.args[1])
				if err != nil {
					return err
				}
				put(&in.args[0], mask(v, in.width))
			case cCvt:
				v, err := get(&in.args[1])
				if err != nil {
					return err
				}
				v = mask(v, in.srcW)
				if in.signed {
					v = uint64(sext(v, in.srcW))
				}
				put(&in.args[0], mask(v, in.width))
			case cSetp:
				a, b, err := get2()
				if err != nil {
					return err
				}
				a, b = mask(a, in.width), mask(b, in.width)
				lt, eq := a < b, a == b
				if in.signed {
					lt = sext(a, in.width) < sext(b, in.width)
				}
				var r bool
				switch in.sub {
				case "eq":
					r = eq
				case "ne":
					r = !eq
				case "lt":
					r = lt
				case "le":
					r = lt || eq
				case "gt":
					r = !lt && !eq
				case "ge":
					r = !lt
				}
				v := uint64(0)
				if r {
					v = 1
				}
				put(&in.args[0], v)
			case cSelp:
				p, err := get(&in.args[3])
				if err != nil {
					return err
				}
				pick := &in.args[2]
				if p != 0 {
					pick = &in.args[1]
				}
				v, err := get(pick)
				if err != nil {
					return err
				}
				put(&in.args[0], mask(v, in.width))
			case cBin:
				a, b, err := get2()
				if err != nil {
					return err
				}
				w := in.width
				var r uint64
				switch in.sub {
				case "add":
					r = a + b
				case "sub":
					r = a - b
				case "mul":
					r = a * b
				case "and":
					r = a & b
				case "or":
					r = a | b
				case "xor":
					r = a ^ b
				case "shl":
					// Shift amounts past the width are clamped to it.
					if b >= uint64(w) {
						r = 0
					} else {
						r = a << b
					}
				case "shr":
					switch {
					case in.signed:
						r = uint64(sext(a, w) >> min(b, uint64(w)-1))
					case b >= uint64(w):
						r = 0
					default:
						r = mask(a, w) >> b
					}
				case "min", "max":
					less := mask(a, w) < mask(b, w)
					if in.signed {
						less = sext(a, w) < sext(b, w)
					}
					if less == (in.sub == "min") {
						r = a
					} else {
						r = b
					}
				}
				put(&in.args[0], mask(r, w))
			case cMulWide:
				a, b, err := get2()
				if err != nil {
					return err
				}
				var c uint64
				if in.sub == "mad" {
					if c, err = get(&in.args[3]); err != nil {
						return err
					}
				}
				put(&in.args[0], mask(a, 32)*mask(b, 32)+c)
			case cShf, cPrmt:
				a, b, err := get2()
				if err != nil {
					return err
				}
				c, err := get(&in.args[3])
				if err != nil {
					return err
				}
				put(&in.args[0], funnel(in.code, in.sub, uint32(a), uint32(b), uint32(c)))
			case cPack:
				// mov.b64 d, {lo, hi}
				var v uint64
				for i, r := range in.args[1].vec {
					if !set[r] {
						return fmt.Errorf("reads %s before it is written", k.regName[r])
					}
					v |= regs[r] << (in.width / 2 * uint(i))
				}
				put(&in.args[0], v)
			case cUnpack:
				// mov.b64 {lo, hi}, a
				v, err := get(&in.args[1])
				if err != nil {
					return err
				}
				for i, r := range in.args[0].vec {
					regs[r], set[r] = mask(v>>(in.width/2*uint(i)), in.width/2), true
				}
			case cDiv:
				a, b, err := get2()
				if err != nil {
					return err
				}
				a, b = mask(a, 32), mask(b, 32)
				if b == 0 {
					return fmt.Errorf("%s by zero (undefined in PTX)", in.sub)
				}
				if in.sub == "div" {
					put(&in.args[0], a/b)
				} else {
					put(&in.args[0], a%b)
				}
			case cDivF32:
				a, b, err := get2()
				if err != nil {
					return err
				}
				// Go rounds float32 arithmetic to float32, to nearest
				// even, subnormals kept: div.rn.f32 without .ftz. (A
				// NaN result has the host's bits, not the GPU's
				// canonical 0x7FFFFFFF: kernels must not store one.)
				x, y := math.Float32frombits(uint32(a)), math.Float32frombits(uint32(b))
				var q float32
				switch in.sub {
				case "div":
					q = x / y
				case "mul":
					q = x * y
				default:
					q = x + y
				}
				put(&in.args[0], uint64(math.Float32bits(q)))
			case cF8:
				return k.execF8(in, get, put)
			case cClz:
				a, err := get(&in.args[1])
				if err != nil {
					return err
				}
				put(&in.args[0], uint64(bits.LeadingZeros32(uint32(a))))
			case cLd, cSt:
				val, am := &in.args[0], &in.args[1]
				if in.code == cSt {
					val, am = &in.args[1], &in.args[0]
				}
				a, err := addr(am)
				if err != nil {
					return err
				}
				size := int(in.width / 8)
				var m []byte
				if in.shared {
					m, err = sh.at(a, size*in.vec, in.code == cSt)
				} else {
					m, err = mem.at(a, size*in.vec, in.code == cSt)
				}
				if err != nil {
					return err
				}
				regsOf := []int{val.reg}
				if val.kind == argVec {
					regsOf = val.vec
				}
				for i, r := range regsOf {
					b := m[i*size : (i+1)*size]
					if in.code == cLd {
						regs[r], set[r] = loadLE(b), true
						continue
					}
					if !set[r] {
						return fmt.Errorf("stores %s before it is written", k.regName[r])
					}
					storeLE(b, regs[r])
				}
			case cRed:
				a, err := addr(&in.args[0])
				if err != nil {
					return err
				}
				v, err := get(&in.args[1])
				if err != nil {
					return err
				}
				m, err := mem.at(a, 8, true)
				if err != nil {
					return err
				}
				storeLE(m, loadLE(m)+v)
			case cAtom:
				a, err := addr(&in.args[1])
				if err != nil {
					return err
				}
				v, err := get(&in.args[2])
				if err != nil {
					return err
				}
				m, err := mem.at(a, int(in.width/8), true)
				if err != nil {
					return err
				}
				old := loadLE(m)
				switch in.sub {
				case "add":
					v += old
				case "max":
					v = max(v, old)
				}
				storeLE(m, mask(v, in.width))
				put(&in.args[0], old)
			case cMembar:
			default:
				return fmt.Errorf("unknown instruction")
			}
			return nil
		}()
		if err == errRet {
			th.done = true
			return nil
		}
		if err != nil {
			return fmt.Errorf("line %d (%s): %w", in.line, in.op, err)
		}
	}
}

var errRet = fmt.Errorf("ret")

// funnel executes shf (sub says "l.wrap", "r.clamp"...) or prmt on the
// 64-bit value b:a (b the high word) with c as the PTX ISA defines them.
func funnel(code ptxCode, sub string, a, b, c uint32) uint64 {
	ba := uint64(b)<<32 | uint64(a)
	if code == cPrmt {
		var d uint32
		for i := range 4 {
			sel := c >> (4 * i) & 0xf
			v := uint32(ba >> (8 * (sel & 7)) & 0xff)
			if sel&8 != 0 { // replicate the byte's sign
				v = 0
				if ba>>(8*(sel&7)+7)&1 != 0 {
					v = 0xff
				}
			}
			d |= v << (8 * i)
		}
		return uint64(d)
	}
	n := c & 31
	if strings.HasSuffix(sub, "clamp") {
		n = min(c, 32)
	}
	if strings.HasPrefix(sub, "l") {
		return ba << n >> 32 & 0xffffffff
	}
	return ba >> n & 0xffffffff
}

// loadLE returns the little-endian value of b, zero-extended.
func loadLE(b []byte) uint64 {
	var v uint64
	for j := len(b) - 1; j >= 0; j-- {
		v = v<<8 | uint64(b[j])
	}
	return v
}

// storeLE writes the low len(b) bytes of v into b, little-endian.
func storeLE(b []byte, v uint64) {
	for j := range b {
		b[j] = byte(v >> (8 * j))
	}
}

// ptxSnippet wraps body (declarations and instructions) into a kernel of
// one u64 parameter p.
func ptxSnippet(body string) string {
	return ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(\n.param .u64 p\n)\n{\n" +
		".reg .pred %p<2>;\n.reg .b16 %h<2>;\n.reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n" + body + "\nret;\n}\n"
}

// runSnippet compiles body (see ptxSnippet), failing the test if that
// fails, and runs it as one thread with p = 0x1000, on 16 writable bytes
// at p (returned) and 16 read-only ones at p+32.
func runSnippet(t *testing.T, body string) ([]byte, error) {
	t.Helper()
	k, err := compilePTX("snippet.ptx", ptxSnippet(body))
	if err != nil {
		t.Fatalf("%q: %v", body, err)
	}
	const p = 0x1000
	out := make([]byte, 16)
	mem := &ptxMemory{}
	mem.add(p, out)
	mem.addRegion(p+32, make([]byte, 16), true, "input")
	return out, k.run(mem, 1, 1, p)
}

// TestPTXInterpreterRefuses checks that the interpreter's checks fire:
// each snippet is refused, statically or when run, with the message given.
func TestPTXInterpreterRefuses(t *testing.T) {
	static := map[string]string{
		"add.u64 %rd1, %rd2, %r1;":                           "32-bit register",
		"add.u32 %r1, %rd2, %r1;":                            "64-bit register",
		"and.u64 %rd1, %rd1, 1;":                             "not one of .b types",
		"add.b64 %rd1, %rd1, 1;":                             "not one of .u/.s types",
		"shl.b64 %rd1, %rd1, %rd2;":                          "64-bit register, the operand is 32-bit",
		"sub.u32 %r1, 126, %r2;":                             "want a register",
		"add.u32 %r1, %r2, 0x100000000;":                     "does not fit 32 bits",
		"@%p1 bra.uni L;\nL:":                                "bra.uni under a predicate",
		"bra L;":                                             "undefined label",
		"mov.u32 %r9, 0;":                                    "undeclared register",
		"mov.u32 %tid.x, 0;":                                 "read-only",
		"setp.lt.b32 %p1, %r1, %r2;":                         "not one of .u/.s types",
		"setp.lt.u32 %r1, %r1, %r2;":                         "32-bit register, the operand is 1-bit",
		"selp.b32 %r1, %r2, %r3, %r1;":                       "32-bit register, the operand is 1-bit",
		"ld.global.v2.u64 {%rd1, %r1}, [%rd2];":              "no declared 64-bit register",
		"ld.global.u32 %rd1, [%rd2];":                        "64-bit register, the operand is 32-bit",
		"ld.global.u16 %r1, [%r2];":                          "no declared 64-bit register",
		"ld.param.u32 %r1, [p];":                             "8-byte parameter",
		"st.global.v4.u64 [%rd1], {%rd1, %rd1, %rd1, %rd1};": "at most 128 bits",
		"mad.lo.u32 %r1, %r1, %r1, %r1;":                     "knows mad.wide.u32 only",
		"shf.r.wrap.b64 %rd1, %rd1, %rd1, 3;":                "unknown shf.r.wrap.b64",
		"shf.r.wrap.b32 %r1, %r1, 5, %r2;":                   "want a register",
		"prmt.b32.f4e %r1, %r1, %r1, 0;":                     "generic form",
		"cvt.u64.b32 %rd1, %r1;":                             "not one of .u/.s types",
		"div.rn.f32 %r1, %r2, 2;":                            "want a register",
		".reg .u32 %u;\ndiv.rn.f32 %r1, %u, %r2;":            "need .f32 or .b32 registers",
		"div.rn.f32 %rd1, %r1, %r2;":                         "64-bit register",
		"div.full.f32 %r1, %r1, %r2;":                        "div.u32, rem.u32 and div.rn.f32 only",
		"mul.rn.f32 %r1, %r2, 2;":                            "want a register",
		".reg .u32 %u;\nadd.rn.f32 %r1, %u, %r2;":            "need .f32 or .b32 registers",
		"mul.f32 %r1, %r1, %r2;":                             "want mul.lo or mul.wide",
		"add.f32 %r1, %r1, %r2;":                             "not one of .u/.s types",
		"div.s32 %r1, %r1, %r2;":                             "div.u32, rem.u32 and div.rn.f32 only",
	}
	for body, want := range static {
		_, err := compilePTX("snippet.ptx", ptxSnippet(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error saying %q", body, err, want)
		}
	}
	running := map[string]string{
		"add.u32 %r1, %r2, 1;":                                                   "reads %r2 before it is written",
		"ld.param.u64 %rd1, [p];\nld.global.u32 %r1, [%rd1+2];":                  "misaligned 4-byte access",
		"ld.param.u64 %rd1, [p];\nld.global.v2.u64 {%rd2, %rd3}, [%rd1+8];":      "misaligned 16-byte access",
		"ld.param.u64 %rd1, [p];\nld.global.u64 %rd2, [%rd1+16];":                "outside every region",
		"ld.param.u64 %rd1, [p];\nmov.u16 %h1, 7;\nst.global.u8 [%rd1+32], %h1;": "read-only",
		"mov.u32 %r1, 7;\nmov.u32 %r2, 0;\nrem.u32 %r1, %r1, %r2;":               "rem by zero",
	}
	for body, want := range running {
		if _, err := runSnippet(t, body); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: ran with %v, want an error saying %q", body, err, want)
		}
	}
}

// TestPTXInterpreterSemantics runs single instructions whose results the
// PTX ISA defines at the edges: truncation to the type's width, shifts
// past the width, signed comparisons and shifts, zero-extending loads
// into wider registers, stores of a register's low bytes, clz of zero.
func TestPTXInterpreterSemantics(t *testing.T) {
	cases := []struct {
		body string
		want uint64 // stored at [p] as a u64 by the snippet's last line
	}{
		{"mov.u32 %r1, -1;\nadd.u32 %r1, %r1, 2;\ncvt.u64.u32 %rd1, %r1;", 1},
		{"mov.u64 %rd1, 1;\nshl.b64 %rd1, %rd1, 64;", 0},
		{"mov.u64 %rd1, 1;\nshl.b64 %rd1, %rd1, 63;", 1 << 63},
		{"mov.u32 %r1, 0x80000000;\nshr.s32 %r1, %r1, 40;\ncvt.u64.u32 %rd1, %r1;", 0xFFFFFFFF},
		{"mov.u32 %r1, 0x80000000;\nshr.u32 %r1, %r1, 31;\ncvt.u64.u32 %rd1, %r1;", 1},
		{"mov.u32 %r1, -1;\nsetp.lt.s32 %p1, %r1, 0;\nselp.b64 %rd1, 5, 6, %p1;", 5},
		{"mov.u32 %r1, -1;\nsetp.lt.u32 %p1, %r1, 0;\nselp.b64 %rd1, 5, 6, %p1;", 6},
		{"mov.u32 %r1, 0;\nclz.b32 %r1, %r1;\ncvt.u64.u32 %rd1, %r1;", 32},
		{"mov.u32 %r1, 0x1000;\nclz.b32 %r1, %r1;\ncvt.u64.u32 %rd1, %r1;", 19},
		{"mov.u32 %r1, 7;\nmin.u32 %r1, %r1, 3;\ncvt.u64.u32 %rd1, %r1;", 3},
		{"mov.u32 %r1, 0x80000001;\nshf.r.wrap.b32 %r1, %r1, %r1, 7;\ncvt.u64.u32 %rd1, %r1;", 0x03000000},
		{"mov.u32 %r1, 0x12345678;\nmov.u32 %r2, 0x9abcdef0;\nshf.r.wrap.b32 %r1, %r1, %r2, 36;\ncvt.u64.u32 %rd1, %r1;", 0x01234567},
		{"mov.u32 %r1, 0x12345678;\nmov.u32 %r2, 0x9abcdef0;\nshf.r.clamp.b32 %r1, %r1, %r2, 36;\ncvt.u64.u32 %rd1, %r1;", 0x9abcdef0},
		{"mov.u32 %r1, 0x12345678;\nmov.u32 %r2, 0x9abcdef0;\nshf.l.wrap.b32 %r1, %r1, %r2, 8;\ncvt.u64.u32 %rd1, %r1;", 0xbcdef012},
		{"mov.u32 %r1, 0x12345678;\nprmt.b32 %r1, %r1, %r1, 0x1032;\ncvt.u64.u32 %rd1, %r1;", 0x56781234},
		{"mov.u32 %r1, 0x12345678;\nprmt.b32 %r1, %r1, %r1, 0x0321;\ncvt.u64.u32 %rd1, %r1;", 0x78123456},
		{"mov.u32 %r1, 0x12345678;\nmov.u32 %r2, 0x9abcdef0;\nprmt.b32 %r1, %r1, %r2, 0x7f40;\ncvt.u64.u32 %rd1, %r1;", 0x9afff078},
		{"mov.u64 %rd1, -7046029254386353131;", 0x9e3779b97f4a7c15},
		{"mov.u64 %rd1, 0xffffffffffffffff;\nmul.lo.u64 %rd1, %rd1, %rd1;", 1},
		{"mov.u32 %r1, 0xffffffff;\nmul.wide.u32 %rd1, %r1, %r1;", 0xfffffffe00000001},
		{"mov.u32 %r1, 0xffffffff;\nmov.u64 %rd1, 0xffffffff;\nmad.wide.u32 %rd1, %r1, %r1, %rd1;", 0xffffffff00000000},
		{"mov.u32 %r1, 0x12345;\ncvt.u16.u32 %h1, %r1;\ncvt.u64.u16 %rd1, %h1;", 0x2345},
		{"mov.u32 %r1, 100;\ndiv.u32 %r1, %r1, 7;\ncvt.u64.u32 %rd1, %r1;", 14},
		{"mov.u32 %r1, 100;\nmov.u32 %r2, 7;\nrem.u32 %r1, %r1, %r2;\ncvt.u64.u32 %rd1, %r1;", 2},
		// 1/3 rounds up; 3·2^-149 / 2 = 1.5·2^-149 is a tie, to even 2·2^-149;
		// 2^-126 / 448 is subnormal, kept (no flush to zero).
		{"mov.b32 %r1, 0x3F800000;\nmov.b32 %r2, 0x40400000;\ndiv.rn.f32 %r1, %r1, %r2;\ncvt.u64.u32 %rd1, %r1;", 0x3EAAAAAB},
		{"mov.b32 %r1, 3;\nmov.b32 %r2, 0x40000000;\ndiv.rn.f32 %r1, %r1, %r2;\ncvt.u64.u32 %rd1, %r1;", 2},
		{"mov.b32 %r1, 0x00800000;\nmov.b32 %r2, 0x43E00000;\ndiv.rn.f32 %r1, %r1, %r2;\ncvt.u64.u32 %rd1, %r1;", 0x00004925},
		// mul and add: 2^-149 · 512 is exact (a subnormal scaled up);
		// 2.5 + 2^23 is a tie, to even 2^23 + 2; 1 + 2^-24 rounds to 1.
		{"mov.b32 %r1, 1;\nmov.b32 %r2, 0x44000000;\nmul.rn.f32 %r1, %r1, %r2;\ncvt.u64.u32 %rd1, %r1;", 0x00000200},
		{"mov.b32 %r1, 0x40200000;\nmov.b32 %r2, 0x4B000000;\nadd.rn.f32 %r1, %r1, %r2;\ncvt.u64.u32 %rd1, %r1;", 0x4B000002},
		{"mov.b32 %r1, 0x3F800000;\nmov.b32 %r2, 0x33800000;\nadd.rn.f32 %r1, %r1, %r2;\ncvt.u64.u32 %rd1, %r1;", 0x3F800000},
		{"mov.b32 %r1, 0x3F800001;\nmov.b32 %r2, 0x3FFFFFFF;\nmul.rn.f32 %r1, %r1, %r2;\ncvt.u64.u32 %rd1, %r1;", 0x40000000},
		{"ld.param.u64 %rd2, [p];\nmov.u64 %rd1, -1;\nst.global.u64 [%rd2+8], %rd1;\nmov.u32 %r1, 0x1234;\nst.global.u8 [%rd2+8], %r1;\nld.global.u64 %rd1, [%rd2+8];", 0xFFFFFFFFFFFFFF34},
		{"ld.param.u64 %rd2, [p];\nmov.u64 %rd1, -1;\nst.global.u64 [%rd2+8], %rd1;\nld.global.u16 %r1, [%rd2+8];\ncvt.u64.u32 %rd1, %r1;", 0xFFFF},
		{"ld.param.u64 %rd2, [p];\nmov.u64 %rd1, 40;\nst.global.u64 [%rd2], %rd1;\nmov.u64 %rd1, 2;\nred.global.add.u64 [%rd2], %rd1;\nld.global.u64 %rd1, [%rd2];", 42},
	}
	for _, c := range cases {
		out, err := runSnippet(t, c.body+"\nld.param.u64 %rd3, [p];\nst.global.u64 [%rd3], %rd1;")
		if err != nil {
			t.Errorf("%q: %v", c.body, err)
			continue
		}
		if got := binary.LittleEndian.Uint64(out); got != c.want {
			t.Errorf("%q: %#x, want %#x", c.body, got, c.want)
		}
	}
}

// collectivePTX is a kernel of the interpreter's tests of shuffles,
// barriers and shared memory: each thread's value t·(2^32+1)+1 (both
// halves busy) is added over its warp with five butterfly shuffles of
// the halves, lane 0 of each warp writes the warp's sum to shared memory,
// and after a barrier every thread adds the first nwarps sums and stores
// the total at p + 8t. pre is placed before the shuffles (labels STEP0 to
// STEP4 start their five steps), post after the barrier.
func collectivePTX(maxntid, nwarps int, pre, post string) string {
	var b strings.Builder
	fmt.Fprintf(&b, ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(\n.param .u64 p\n)\n.maxntid %d, 1, 1\n.minnctapersm 2\n{\n", maxntid)
	b.WriteString(".reg .pred %p<2>;\n.reg .b32 %r<12>;\n.reg .b64 %rd<8>;\n.shared .align 8 .b8 warps[64];\n")
	b.WriteString("ld.param.u64 %rd1, [p];\nmov.u32 %r1, %tid.x;\ncvt.u64.u32 %rd2, %r1;\nmul.lo.u64 %rd3, %rd2, 4294967297;\nadd.u64 %rd3, %rd3, 1;\n")
	b.WriteString(pre)
	for i, lanes := range []int{16, 8, 4, 2, 1} {
		fmt.Fprintf(&b, "STEP%d:\nmov.b64 {%%r2, %%r3}, %%rd3;\nshfl.sync.bfly.b32 %%r4, %%r2, %d, 31, 0xffffffff;\nshfl.sync.bfly.b32 %%r5, %%r3, %d, 31, -1;\nmov.b64 %%rd4, {%%r4, %%r5};\nadd.u64 %%rd3, %%rd3, %%rd4;\n", i, lanes, lanes)
	}
	b.WriteString("and.b32 %r6, %r1, 31;\nshr.u32 %r7, %r1, 5;\nsetp.ne.u32 %p1, %r6, 0;\n@%p1 bra WAIT;\nmov.u32 %r8, warps;\nshl.b32 %r9, %r7, 3;\nadd.u32 %r8, %r8, %r9;\nst.shared.u64 [%r8], %rd3;\nWAIT:\nbar.sync 0;\n")
	b.WriteString(post)
	b.WriteString("mov.u32 %r8, warps;\nmov.u64 %rd5, 0;\n")
	for w := range nwarps {
		fmt.Fprintf(&b, "ld.shared.u64 %%rd6, [%%r8+%d];\nadd.u64 %%rd5, %%rd5, %%rd6;\n", 8*w)
	}
	b.WriteString("shl.b64 %rd7, %rd2, 3;\nadd.s64 %rd7, %rd1, %rd7;\nst.global.u64 [%rd7], %rd5;\nret;\n}\n")
	return b.String()
}

// TestPTXInterpreterCollectives runs shuffles, a barrier and shared memory
// (collectivePTX) on blocks of one to four warps, and checks that what the
// GPU would hang on or leave undefined is refused: lanes that leave a
// shuffle, partial warps, a barrier some threads exited before, shared
// memory read before it is written, a block larger than .maxntid.
func TestPTXInterpreterCollectives(t *testing.T) {
	const p = 0x10000
	run := func(src string, threads int) ([]byte, error) {
		k, err := compilePTX("collective.ptx", src)
		if err != nil {
			t.Fatalf("%v", err)
		}
		out := make([]byte, 8*threads)
		mem := &ptxMemory{}
		mem.add(p, out)
		return out, k.run(mem, 2, threads, p)
	}
	for _, threads := range []int{32, 64, 128} {
		out, err := run(collectivePTX(128, threads/32, "", ""), threads)
		if err != nil {
			t.Fatalf("%d threads: %v", threads, err)
		}
		var want uint64
		for i := range uint64(threads) {
			want += i*(1<<32+1) + 1
		}
		for i := range threads {
			if got := binary.LittleEndian.Uint64(out[8*i:]); got != want {
				t.Fatalf("%d threads: thread %d has %#x, want %#x", threads, i, got, want)
			}
		}
	}
	for name, c := range map[string]struct {
		src     string
		threads int
		want    string
	}{
		"lanes leave":      {collectivePTX(128, 1, "setp.eq.u32 %p1, %r1, 3;\n@%p1 bra STEP1;\n", ""), 32, "lane 3 of warp 0 waits at line"},
		"lanes exit":       {collectivePTX(128, 1, "setp.eq.u32 %p1, %r1, 5;\n@%p1 ret;\n", ""), 32, "lane 5 of warp 0 has exited"},
		"partial warp":     {collectivePTX(128, 1, "", ""), 48, "a warp of 16 threads"},
		"barrier exited":   {collectivePTX(128, 1, "", "setp.ge.u32 %p1, %r1, 32;\n@%p1 ret;\nbar.sync 0;\n"), 64, "32 threads of the block exited before the barrier"},
		"unwritten shared": {collectivePTX(128, 3, "", ""), 64, "before a thread of the block wrote it"},
		"past .maxntid":    {collectivePTX(64, 2, "", ""), 96, "past the kernel's .maxntid 64"},
	} {
		if _, err := run(c.src, c.threads); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: ran with %v, want an error saying %q", name, err, c.want)
		}
	}
	for body, want := range map[string]string{
		"shfl.sync.down.b32 %r1, %r2, 1, 31, -1;":      "shfl.sync.bfly.b32 only",
		"shfl.sync.bfly.b32 %r1, %r2, 1, 31, 0xffff;":  "full-warp shuffles only",
		"@%p1 shfl.sync.bfly.b32 %r1, %r2, 1, 31, -1;": "under a predicate",
		"shfl.sync.bfly.b32 %r1, %r2, 1, %r3, -1;":     "an immediate clamp",
		"bar.sync 1;": "bar.sync 0 only",
		".shared .align 8 .b8 s[8];\nmov.u64 %rd1, s;":            "is 32-bit",
		".shared .align 8 .b8 s[8];\nld.shared.u64 %rd1, [%rd2];": "no declared 32-bit register",
		"ld.shared.nc.u32 %r1, [%r2];":                            "no cache qualifiers on .shared",
		"ld.global.L2::256B.nc.u64 %rd1, [%rd2];":                 "out of order",
		"st.global.nc.u64 [%rd1], %rd2;":                          "unknown here",
		"mov.u32 {%r1, %r2}, %rd1;":                               "only mov.b64 and mov.b32",
		"mov.b32 {%r1, %r2}, %rd1;":                               "no declared 16-bit register",
		"mov.b64 {%r1, %rd2}, %rd1;":                              "no declared 32-bit register",
		".shared .align 3 .b8 s[8];":                              "bad shared array",
	} {
		if _, err := compilePTX("snippet.ptx", ptxSnippet(body)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: got %v, want an error saying %q", body, err, want)
		}
	}
	if _, err := compilePTX("snippet.ptx", strings.Replace(ptxSnippet("ret;"), ")\n{", ")\n.minnctapersm 2\n{", 1)); err == nil || !strings.Contains(err.Error(), "without .maxntid") {
		t.Errorf(".minnctapersm alone: %v", err)
	}
	for _, body := range []string{
		"ld.param.u64 %rd1, [p];\nld.global.nc.L1::no_allocate.L2::256B.v2.u64 {%rd2, %rd3}, [%rd1+32];\nst.global.cs.v2.u64 [%rd1], {%rd2, %rd3};",
		"ld.param.u64 %rd1, [p];\nld.global.L1::no_allocate.u64 %rd2, [%rd1+32];\nst.global.L1::no_allocate.u64 [%rd1], %rd2;",
	} {
		if _, err := runSnippet(t, body); err != nil {
			t.Errorf("%q: %v", body, err)
		}
	}
}

// skipUnderRace skips one of the long runs of the PTX interpreter under
// the race detector: the interpreter starts no goroutine, so the detector
// has nothing to find there, and it runs about 15 times slower (TestQuantPTX:
// 37 s against 2.5). `make test` runs these tests again without it
// (go test -run PTX ./gpu).
func skipUnderRace(t *testing.T) {
	t.Helper()
	if raceDetector {
		t.Skip("skipping under the race detector: the PTX interpreter starts no goroutine; make test runs it without (go test -run PTX ./gpu)")
	}
}
