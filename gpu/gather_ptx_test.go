package gpu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// The tests below run the embedded gather.ptx on the host, through a small
// interpreter of the PTX subset it is written in, so that the kernel's text
// and logic are checked where no GPU is: every register must be declared,
// every label defined, every access inside memory and aligned to its size
// (a GPU faults otherwise), and the copies must come out byte for byte.
// Threads run one after another: the kernel has no shared memory and no
// barriers, and its threads write disjoint bytes, so any order gives the
// same result. The PTX compiler's own checks happen on a GPU only
// (TestGatherGPU, and the self-test each device runs before using it).

type ptxOperand struct {
	reg    string // "%rd3", "%tid.x"; empty for an immediate or a parameter
	imm    uint64
	param  string   // [name]
	mem    bool     // [reg+imm]
	vector []string // {%v0, %v1, %v2, %v3}
}

type ptxInst struct {
	line   int
	pred   string // guard register, "" when none
	negate bool
	op     []string // "ld", "global", "v4", "u32"
	args   []ptxOperand
	target string // bra
}

type ptxKernel struct {
	name   string
	params []string // in order
	sizes  map[string]int
	regs   map[string]bool
	insts  []ptxInst
	labels map[string]int
}

func parsePTX(t *testing.T, src string) *ptxKernel {
	t.Helper()
	k := &ptxKernel{sizes: map[string]int{}, regs: map[string]bool{}, labels: map[string]int{}}
	var sawVersion, sawTarget, inParams bool
	for n, raw := range strings.Split(src, "\n") {
		line := raw
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		fail := func(format string, a ...any) {
			t.Helper()
			t.Fatalf("gather.ptx:%d: %s: %q", n+1, fmt.Sprintf(format, a...), raw)
		}
		switch {
		case strings.HasPrefix(line, ".version "):
			sawVersion = true
			continue
		case strings.HasPrefix(line, ".target "):
			if !sawVersion {
				fail(".target before .version")
			}
			sawTarget = true
			continue
		case strings.HasPrefix(line, ".address_size "):
			if line != ".address_size 64" {
				fail("want 64-bit addresses")
			}
			continue
		case strings.HasPrefix(line, ".visible .entry "):
			if !sawTarget {
				fail("kernel before .target")
			}
			k.name = strings.TrimSuffix(strings.TrimPrefix(line, ".visible .entry "), "(")
			inParams = true
			continue
		case inParams && line == ")":
			inParams = false
			continue
		case inParams:
			f := strings.Fields(strings.TrimSuffix(line, ","))
			if len(f) != 3 || f[0] != ".param" {
				fail("bad parameter")
			}
			k.params = append(k.params, f[2])
			k.sizes[f[2]] = map[string]int{".u32": 4, ".u64": 8}[f[1]]
			continue
		case line == "{" || line == "}":
			continue
		case strings.HasPrefix(line, ".reg "):
			f := strings.Fields(strings.TrimSuffix(line, ";"))
			if len(f) != 3 || !strings.HasPrefix(f[2], "%") {
				fail("bad register declaration")
			}
			name, count, ok := strings.Cut(f[2], "<")
			if !ok {
				k.regs[name] = true
				continue
			}
			c, err := strconv.Atoi(strings.TrimSuffix(count, ">"))
			if err != nil {
				fail("bad register count")
			}
			for i := range c {
				k.regs[name+strconv.Itoa(i)] = true
			}
			continue
		}
		if label, rest, ok := strings.Cut(line, ":"); ok && !strings.ContainsAny(label, " \t[") {
			if _, dup := k.labels[label]; dup {
				fail("label defined twice")
			}
			k.labels[label] = len(k.insts)
			line = strings.TrimSpace(rest)
			if line == "" {
				continue
			}
		}
		if !strings.HasSuffix(line, ";") {
			fail("instruction without ';'")
		}
		line = strings.TrimSuffix(line, ";")
		in := ptxInst{line: n + 1}
		if strings.HasPrefix(line, "@") {
			g, rest, _ := strings.Cut(line, " ")
			in.pred = strings.TrimPrefix(g, "@")
			if strings.HasPrefix(in.pred, "!") {
				in.negate, in.pred = true, in.pred[1:]
			}
			if !k.regs[in.pred] {
				fail("undeclared predicate %s", in.pred)
			}
			line = strings.TrimSpace(rest)
		}
		opText, argText, _ := strings.Cut(line, " ")
		opText, _, _ = strings.Cut(opText, "\t")
		argText = strings.TrimSpace(strings.TrimPrefix(line, opText))
		in.op = strings.Split(opText, ".")
		if in.op[0] == "bra" {
			in.target = argText
			k.insts = append(k.insts, in)
			continue
		}
		for _, a := range splitArgs(argText) {
			op, err := parseOperand(a, k)
			if err != nil {
				fail("%v", err)
			}
			in.args = append(in.args, op)
		}
		k.insts = append(k.insts, in)
	}
	for _, in := range k.insts {
		if in.target != "" {
			if _, ok := k.labels[in.target]; !ok {
				t.Fatalf("gather.ptx:%d: branch to undefined label %s", in.line, in.target)
			}
		}
	}
	if k.name == "" || len(k.insts) == 0 {
		t.Fatal("gather.ptx: no kernel found")
	}
	return k
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

var ptxSpecial = map[string]bool{"%ctaid.x": true, "%tid.x": true, "%ntid.x": true}

func parseOperand(a string, k *ptxKernel) (ptxOperand, error) {
	switch {
	case strings.HasPrefix(a, "{"):
		var op ptxOperand
		for _, r := range strings.Split(strings.Trim(a, "{}"), ",") {
			r = strings.TrimSpace(r)
			if !k.regs[r] {
				return op, fmt.Errorf("undeclared register %s", r)
			}
			op.vector = append(op.vector, r)
		}
		return op, nil
	case strings.HasPrefix(a, "["):
		inner := strings.Trim(a, "[]")
		if _, ok := k.sizes[inner]; ok {
			return ptxOperand{param: inner}, nil
		}
		reg, off, _ := strings.Cut(inner, "+")
		op := ptxOperand{reg: reg, mem: true}
		if !k.regs[reg] {
			return op, fmt.Errorf("undeclared address register %s", reg)
		}
		if off != "" {
			v, err := strconv.ParseUint(off, 10, 64)
			if err != nil {
				return op, err
			}
			op.imm = v
		}
		return op, nil
	case strings.HasPrefix(a, "%"):
		if !k.regs[a] && !ptxSpecial[a] {
			return ptxOperand{}, fmt.Errorf("undeclared register %s", a)
		}
		return ptxOperand{reg: a}, nil
	}
	v, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return ptxOperand{}, fmt.Errorf("bad operand %q", a)
	}
	return ptxOperand{imm: v}, nil
}

// ptxMemory is a flat simulated address space of a few regions.
type ptxMemory struct {
	base []uint64
	data [][]byte
}

func (m *ptxMemory) add(base uint64, b []byte) {
	m.base = append(m.base, base)
	m.data = append(m.data, b)
}

func (m *ptxMemory) at(addr uint64, n int) ([]byte, error) {
	if addr%uint64(n) != 0 {
		return nil, fmt.Errorf("misaligned %d-byte access at %#x", n, addr)
	}
	for i, b := range m.base {
		if addr >= b && addr+uint64(n) <= b+uint64(len(m.data[i])) {
			return m.data[i][addr-b : addr-b+uint64(n)], nil
		}
	}
	return nil, fmt.Errorf("illegal address %#x (%d bytes)", addr, n)
}

// run executes the kernel over a grid of blocks×threads with the given
// parameter values (in declaration order).
func (k *ptxKernel) run(mem *ptxMemory, blocks, threads int, params ...uint64) error {
	if len(params) != len(k.params) {
		return fmt.Errorf("%d parameters for %d", len(params), len(k.params))
	}
	pv := map[string]uint64{}
	for i, p := range k.params {
		pv[p] = params[i]
	}
	for b := range blocks {
		for th := range threads {
			if err := k.thread(mem, pv, uint64(b), uint64(th), uint64(threads)); err != nil {
				return fmt.Errorf("block %d thread %d: %w", b, th, err)
			}
		}
	}
	return nil
}

func (k *ptxKernel) thread(mem *ptxMemory, pv map[string]uint64, block, tid, ntid uint64) error {
	regs := map[string]uint64{"%ctaid.x": block, "%tid.x": tid, "%ntid.x": ntid}
	set := map[string]bool{"%ctaid.x": true, "%tid.x": true, "%ntid.x": true}
	val := func(in ptxInst, o ptxOperand) (uint64, error) {
		if o.reg == "" {
			return o.imm, nil
		}
		if !set[o.reg] {
			return 0, fmt.Errorf("line %d reads %s before it is written", in.line, o.reg)
		}
		return regs[o.reg], nil
	}
	for pc, steps := 0, 0; ; steps++ {
		if pc >= len(k.insts) {
			return fmt.Errorf("ran off the end of the kernel")
		}
		if steps > 10_000_000 {
			return fmt.Errorf("no ret after %d instructions", steps)
		}
		in := k.insts[pc]
		pc++
		if in.pred != "" {
			if !set[in.pred] {
				return fmt.Errorf("line %d: predicate %s unset", in.line, in.pred)
			}
			if (regs[in.pred] != 0) == in.negate {
				continue
			}
		}
		op := strings.Join(in.op, ".")
		width := map[string]uint64{"u32": 32, "s32": 32, "b32": 32, "u64": 64, "s64": 64, "b64": 64, "u8": 8, "b16": 16}[in.op[len(in.op)-1]]
		mask := func(v uint64) uint64 {
			if width == 64 || width == 0 {
				return v
			}
			return v & (1<<width - 1)
		}
		write := func(o ptxOperand, v uint64) error {
			if o.reg == "" || ptxSpecial[o.reg] {
				return fmt.Errorf("line %d: %s writes no register", in.line, op)
			}
			regs[o.reg], set[o.reg] = v, true
			return nil
		}
		ab := func() (uint64, uint64, error) {
			if len(in.args) != 3 {
				return 0, 0, fmt.Errorf("line %d: %s wants 3 operands", in.line, op)
			}
			a, err := val(in, in.args[1])
			if err != nil {
				return 0, 0, err
			}
			b, err := val(in, in.args[2])
			return a, b, err
		}
		addr := func(o ptxOperand) (uint64, error) {
			if !o.mem {
				return 0, fmt.Errorf("line %d: %s wants an address", in.line, op)
			}
			b, err := val(in, ptxOperand{reg: o.reg})
			return b + o.imm, err
		}
		var err error
		switch op {
		case "ret":
			return nil
		case "bra", "bra.uni":
			pc = k.labels[in.target]
		case "ld.param.u32", "ld.param.u64":
			p := in.args[1].param
			if k.sizes[p] != int(width/8) {
				return fmt.Errorf("line %d: %s of the %d-byte parameter %s", in.line, op, k.sizes[p], p)
			}
			err = write(in.args[0], mask(pv[p]))
		case "mov.u32", "mov.u64", "cvta.to.global.u64": // global addresses are generic ones
			var v uint64
			if v, err = val(in, in.args[1]); err == nil {
				err = write(in.args[0], mask(v))
			}
		case "cvt.u64.u32":
			var v uint64
			if v, err = val(in, in.args[1]); err == nil {
				err = write(in.args[0], v&(1<<32-1))
			}
		case "setp.ge.u32", "setp.ge.u64", "setp.ne.u64":
			var a, b uint64
			if a, b, err = ab(); err == nil {
				a, b = mask(a), mask(b)
				r := map[string]bool{"ge": a >= b, "ne": a != b}[in.op[1]]
				err = write(in.args[0], map[bool]uint64{true: 1}[r])
			}
		case "mul.wide.u32":
			var a, b uint64
			if a, b, err = ab(); err == nil {
				err = write(in.args[0], (a&(1<<32-1))*(b&(1<<32-1)))
			}
		case "add.s64", "add.u64", "or.b64", "and.b64", "mul.lo.u64", "shl.b64", "shr.u64":
			var a, b uint64
			if a, b, err = ab(); err == nil {
				r := map[string]func() uint64{
					"add": func() uint64 { return a + b }, "or": func() uint64 { return a | b },
					"and": func() uint64 { return a & b }, "mul": func() uint64 { return a * b },
					"shl": func() uint64 { return a << b }, "shr": func() uint64 { return a >> b },
				}[in.op[0]]()
				err = write(in.args[0], r)
			}
		case "ld.global.u64", "ld.global.u8":
			var a uint64
			var m []byte
			if a, err = addr(in.args[1]); err == nil {
				if m, err = mem.at(a, int(width/8)); err == nil {
					var v uint64
					if width == 64 {
						v = binary.LittleEndian.Uint64(m)
					} else {
						v = uint64(m[0])
					}
					if in.op[2] == "u8" && !strings.HasPrefix(in.args[0].reg, "%b") {
						err = fmt.Errorf("line %d: byte load into %s, want the 16-bit register", in.line, in.args[0].reg)
					} else {
						err = write(in.args[0], v)
					}
				}
			}
		case "st.global.u8":
			var a, v uint64
			var m []byte
			if a, err = addr(in.args[0]); err == nil {
				if v, err = val(in, in.args[1]); err == nil {
					if m, err = mem.at(a, 1); err == nil {
						m[0] = byte(v)
					}
				}
			}
		case "ld.global.v4.u32", "st.global.v4.u32":
			ld := in.op[0] == "ld"
			regOp, addrOp := in.args[0], in.args[1]
			if !ld {
				regOp, addrOp = in.args[1], in.args[0]
			}
			if len(regOp.vector) != 4 {
				return fmt.Errorf("line %d: %s wants 4 registers", in.line, op)
			}
			var a uint64
			var m []byte
			if a, err = addr(addrOp); err == nil {
				if m, err = mem.at(a, 16); err == nil {
					for i, r := range regOp.vector {
						if ld {
							regs[r], set[r] = uint64(binary.LittleEndian.Uint32(m[4*i:])), true
						} else {
							v, verr := val(in, ptxOperand{reg: r})
							if verr != nil {
								return verr
							}
							binary.LittleEndian.PutUint32(m[4*i:], uint32(v))
						}
					}
				}
			}
		default:
			return fmt.Errorf("line %d: the test's interpreter does not know %s", in.line, op)
		}
		if err != nil {
			return fmt.Errorf("line %d (%s): %w", in.line, op, err)
		}
	}
}

// TestGatherPTX parses the embedded kernel and runs it on random copies
// (sizes 1 byte to 150 KiB, random alignments) described exactly as Gather
// describes them to the GPU, in small descriptor slots and pieces of
// 16 KiB (so that copies span several pieces).
func TestGatherPTX(t *testing.T) {
	k := parsePTX(t, gatherPTX)
	if k.name != "wc_gather" || len(k.params) != 2 || k.sizes[k.params[0]] != 8 || k.sizes[k.params[1]] != 4 {
		t.Fatalf("kernel %s(%v): want wc_gather(u64 ranges, u32 count)", k.name, k.params)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const size = 1 << 20
	const srcBase, dstBase, descBase = 0x7f0000000000, 0x7f1000000000, 0x7f2000000000
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	want := make([]byte, size)
	var b CopyBatch
	for at := 0; ; {
		n := 1 + int(rng.ExpFloat64()*2000)
		if rng.IntN(8) == 0 {
			n = 1 + rng.IntN(150<<10)
		}
		if rng.IntN(2) == 0 {
			n = (n + 15) &^ 15
		}
		at = (at + rng.IntN(64)) &^ (map[bool]int{true: 15}[rng.IntN(2) == 0])
		if at+n > size {
			break
		}
		s := rng.IntN(size - n)
		if rng.IntN(2) == 0 {
			s &^= 15
		}
		b.Add(dstBase+uint64(at), srcBase+uint64(s), int64(n))
		copy(want[at:at+n], src[s:s+n])
		at += n
	}
	t.Logf("%d copies, %d bytes", b.Len(), b.Bytes())
	const slotRanges = 50
	words := make([]uint64, slotRanges*gatherWords)
	desc := make([]byte, len(words)*8)
	var sp rangeSplitter
	launches := 0
	for !sp.done(&b) {
		n := sp.fill(words, &b, 16<<10)
		for i, w := range words[:n*gatherWords] {
			binary.LittleEndian.PutUint64(desc[8*i:], w)
		}
		mem := &ptxMemory{}
		mem.add(srcBase, src)
		mem.add(dstBase, dst)
		mem.add(descBase, desc[:n*gatherWords*8])
		// A few threads keep the interpreter fast; the loops do not care
		// how many there are.
		threads := []int{32, 64, 256}[launches%3]
		if err := k.run(mem, n, threads, descBase, uint64(n)); err != nil {
			t.Fatalf("launch %d: %v", launches, err)
		}
		launches++
	}
	if i := diffAt(dst, want); i >= 0 {
		t.Fatalf("after %d launches, byte %d is %#x, want %#x", launches, i, dst[i], want[i])
	}
	// A grid larger than count leaves the extra blocks idle.
	mem := &ptxMemory{}
	mem.add(descBase, make([]byte, 24))
	if err := k.run(mem, 4, 32, descBase, 0); err != nil {
		t.Fatalf("blocks past count: %v", err)
	}
}

// TestRangeSplitter checks the descriptors Gather builds: every copy is
// covered exactly once, in pieces of at most the chunk size that start at
// multiples of it (so they keep the copy's alignment), resumable across
// slots of any size.
func TestRangeSplitter(t *testing.T) {
	var b CopyBatch
	sizes := []int64{1, 15, 16, 17, 4096, GatherChunk - 1, GatherChunk, GatherChunk + 1, 3<<20 + 5, 100}
	for i, n := range sizes {
		b.Add(uint64(1+i)<<40, uint64(1+i)<<32+uint64(i), n)
	}
	for _, slot := range []int{1, 2, 7, 1000} {
		var sp rangeSplitter
		out := make([]uint64, slot*gatherWords+2) // room to spare: must not be used
		var got [][3]uint64
		for !sp.done(&b) {
			n := sp.fill(out, &b, GatherChunk)
			if n == 0 || n > slot {
				t.Fatalf("slot of %d: filled %d ranges", slot, n)
			}
			for i := range n {
				got = append(got, [3]uint64(out[i*gatherWords:(i+1)*gatherWords]))
			}
		}
		k := 0
		for i, n := range sizes {
			dst, src := uint64(1+i)<<40, uint64(1+i)<<32+uint64(i)
			for off := uint64(0); off < uint64(n); off += GatherChunk {
				wantLen := min(GatherChunk, uint64(n)-off)
				if k >= len(got) || got[k] != [3]uint64{src + off, dst + off, wantLen} {
					t.Fatalf("slot of %d: range %d is %v, want src %#x dst %#x len %d", slot, k, got[k], src+off, dst+off, wantLen)
				}
				k++
			}
		}
		if k != len(got) {
			t.Fatalf("slot of %d: %d ranges, want %d", slot, len(got), k)
		}
	}
	if GatherChunk%16 != 0 {
		t.Fatal("GatherChunk must keep 16-byte alignment")
	}
}

// TestGatherCheckCopies keeps the device self-test's copies apart and
// inside its buffers.
func TestGatherCheckCopies(t *testing.T) {
	const n = 256 << 10
	used := make([]bool, n)
	for _, c := range gatherCheck {
		if c.src+c.n > n || c.dst+c.n > n {
			t.Fatalf("%+v outside %d bytes", c, n)
		}
		for i := c.dst; i < c.dst+c.n; i++ {
			if used[i] {
				t.Fatalf("%+v overlaps an earlier copy", c)
			}
			used[i] = true
		}
	}
	if !bytes.Contains([]byte(gatherPTX), []byte(".entry wc_gather(")) {
		t.Fatal("gather.ptx has no wc_gather entry")
	}
}
