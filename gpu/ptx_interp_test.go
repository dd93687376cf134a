package gpu

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"testing"
)

// This file holds a small interpreter of the PTX subset that the package's
// hand-written kernels (gather.ptx, checksum.ptx, cast.ptx, ...) are written
// in, so that their text and logic are checked where no GPU is. It checks
// what the PTX assembler would refuse and what would fault on a GPU:
//
//   - every register is declared, every label defined once, every
//     instruction known, and each operand has the width (register class)
//     that the PTX ISA requires of it: for example add.u64 takes 64-bit
//     registers, a shift amount is 32-bit, setp writes a predicate, and
//     and/or/xor/shl take only .b types, add/sub/mul/min/max only .u/.s;
//   - immediates fit the operand's width and appear only where nvcc puts
//     them (the last source, selp's values, mov's source);
//   - bra.uni is never guarded by a predicate (it must not diverge);
//   - at run time, no register is read before it is written, every memory
//     access lies inside a region given to the kernel and is aligned to
//     its full size (a vector access to the vector's size), and nothing is
//     written to a region marked read-only.
//
// Each instruction is executed as the PTX ISA defines it, at its type's
// width: results are truncated to the width, shifts past the width give 0
// (shr.s the sign), setp compares signed for .s types, loads zero-extend
// into a wider register, stores write the low bytes. Threads run one
// after another, to completion: the kernels use no shared memory, no
// barriers, and threads that touch the same memory only do so through
// red (atomic) operations, so any order gives the same result. The PTX
// compiler's own checks happen on a GPU only (the GPU tests, and the
// self-test each device runs before using a kernel).

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
	cMulWide
	cClz
	cShf
	cPrmt
	cLd
	cSt
	cRed
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
	regIdx    map[string]int
	insts     []ptxInst
	labels    map[string]int
	counts    []int // executions of each instruction, over every run
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
	k := &ptxKernel{file: file, regIdx: map[string]int{}, labels: map[string]int{}}
	for i, n := range ptxSpecialNames {
		k.regIdx[n] = i
		k.regName = append(k.regName, n)
		k.regWidth = append(k.regWidth, 32)
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
		case line == "{":
			inBody = true
			continue
		case line == "}":
			inBody = false
			continue
		case strings.HasPrefix(line, ".reg "):
			f := strings.Fields(strings.TrimSuffix(line, ";"))
			widths := map[string]uint{".pred": 1, ".b16": 16, ".u16": 16, ".b32": 32, ".u32": 32, ".s32": 32, ".b64": 64, ".u64": 64, ".s64": 64}
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
			}
			continue
		}
		if !inBody {
			return fail("instruction outside the kernel body")
		}
		if label, rest, ok := strings.Cut(line, ":"); ok && !strings.ContainsAny(label, " \t[") {
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
		if err := typedOp(cMov, 2, "", 1, "usb"); err != nil {
			return err
		}
		return operands([]int{roleDst, roleSrc}, []uint{0, 0})
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
	case "add", "sub", "min", "max", "and", "or", "xor", "shl", "shr", "mul":
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
		if len(parts) < 3 || len(parts) > 4 {
			return fmt.Errorf("unknown %s", in.op)
		}
		if err := typed(parts[len(parts)-1], "usb"); err != nil {
			return err
		}
		if in.signed {
			return fmt.Errorf("%s: the interpreter does not sign-extend loads", in.op)
		}
		in.vec = 1
		if len(parts) == 4 {
			switch parts[2] {
			case "v2":
				in.vec = 2
			case "v4":
				in.vec = 4
			default:
				return fmt.Errorf("%s: bad vector", in.op)
			}
			if uint(in.vec)*in.width > 128 {
				return fmt.Errorf("%s: vectors hold at most 128 bits", in.op)
			}
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
		default:
			return fmt.Errorf("%s: only .param and .global", in.op)
		}
		a, err := k.address(addr)
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
			if !strings.HasPrefix(val, "{") {
				return fmt.Errorf("%s wants a {vector} of registers", in.op)
			}
			v = ptxArg{kind: argVec, text: val}
			for _, r := range strings.Split(strings.Trim(val, "{}"), ",") {
				r = strings.TrimSpace(r)
				i, ok := k.regIdx[r]
				if !ok || k.regWidth[i] != in.width || i < ptxSpecials {
					return fmt.Errorf("%s: %s is no declared %d-bit register", in.op, r, in.width)
				}
				v.vec = append(v.vec, i)
			}
			if len(v.vec) != in.vec {
				return fmt.Errorf("%s wants %d registers, got %d", in.op, in.vec, len(v.vec))
			}
		}
		if in.code == cSt {
			in.args = []ptxArg{a, v}
		} else {
			in.args = []ptxArg{v, a}
		}
		return nil
	case "red":
		if in.op != "red.global.add.u64" {
			return fmt.Errorf("%s: the interpreter knows red.global.add.u64 only", in.op)
		}
		in.code, in.width = cRed, 64
		if err := want(2); err != nil {
			return err
		}
		a, err := k.address(args[0])
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

// address parses [%rdN] or [%rdN+imm].
func (k *ptxKernel) address(a string) (ptxArg, error) {
	if !strings.HasPrefix(a, "[") || !strings.HasSuffix(a, "]") {
		return ptxArg{}, fmt.Errorf("want an [address], got %s", a)
	}
	reg, off, _ := strings.Cut(strings.Trim(a, "[]"), "+")
	r, ok := k.regIdx[reg]
	if !ok || k.regWidth[r] != 64 {
		return ptxArg{}, fmt.Errorf("address register %s is no declared 64-bit register", reg)
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
	if which == nil {
		which = make([]int, blocks)
		for b := range which {
			which[b] = b
		}
	}
	regs := make([]uint64, len(k.regName))
	set := make([]bool, len(k.regName))
	for _, b := range which {
		if b < 0 || b >= blocks {
			return fmt.Errorf("%s: block %d of a grid of %d", k.file, b, blocks)
		}
		for th := range threads {
			clear(set)
			regs[ptxTid], regs[ptxNtid], regs[ptxCtaid], regs[ptxNctaid] = uint64(th), uint64(threads), uint64(b), uint64(blocks)
			set[ptxTid], set[ptxNtid], set[ptxCtaid], set[ptxNctaid] = true, true, true, true
			if err := k.thread(mem, params, regs, set); err != nil {
				return fmt.Errorf("%s: block %d thread %d: %w", k.file, b, th, err)
			}
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

func (k *ptxKernel) thread(mem *ptxMemory, params, regs []uint64, set []bool) error {
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
		return regs[a.reg] + a.imm, nil
	}
	for pc, steps := 0, 0; ; steps++ {
		if pc >= len(k.insts) {
			return fmt.Errorf("ran off the end of the kernel")
		}
		if steps > ptxLimit {
			return fmt.Errorf("no ret after %d instructions", steps)
		}
		in = &k.insts[pc]
		k.counts[pc]++
		pc++
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
				pc = in.target
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
				put(&in.args[0], mask(a, 32)*mask(b, 32))
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
				m, err := mem.at(a, size*in.vec, in.code == cSt)
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
			default:
				return fmt.Errorf("unknown instruction")
			}
			return nil
		}()
		if err == errRet {
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
		"mad.lo.u32 %r1, %r1, %r1, %r1;":                     "does not know mad.lo.u32",
		"shf.r.wrap.b64 %rd1, %rd1, %rd1, 3;":                "unknown shf.r.wrap.b64",
		"shf.r.wrap.b32 %r1, %r1, 5, %r2;":                   "want a register",
		"prmt.b32.f4e %r1, %r1, %r1, 0;":                     "generic form",
		"cvt.u64.b32 %rd1, %r1;":                             "not one of .u/.s types",
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
		{"mov.u32 %r1, 0x12345;\ncvt.u16.u32 %h1, %r1;\ncvt.u64.u16 %rd1, %h1;", 0x2345},
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
