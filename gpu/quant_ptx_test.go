package gpu

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
)

// The tests below run the generated quant.ptx and quant_int.ptx on the
// host, through the PTX interpreter of ptx_interp_test.go, launched
// exactly as Quantizer launches them (quantLaunches), and compare every
// code and scale with package quant. The weight is mapped read-only; each launch's codes go
// to a region of exactly its range's bytes, filled with 0xA5 beforehand,
// so that a store outside the range, a missed element or a load past the
// weight fails; the scales are a region of exactly the weight's blocks.

const (
	ptxQuantSrc    = 0x7f0000000000
	ptxQuantDst    = 0x7f1000000000
	ptxQuantScales = 0x7f2000000000
)

// quantPTXKernels returns the two quantize kernels, parsed: quant.ptx
// (conv) and quant_int.ptx.
func quantPTXKernels(t *testing.T) []struct {
	file string
	conv bool
	k    *ptxKernel
} {
	t.Helper()
	ks := []struct {
		file string
		conv bool
		k    *ptxKernel
	}{{"quant.ptx", true, nil}, {"quant_int.ptx", false, nil}}
	for i, src := range []string{quantPTX, quantIntPTX} {
		k := parsePTX(t, ks[i].file, src)
		if k.name != "wc_quant" || len(k.params) != 9 || k.maxntid != quantThreads {
			t.Fatalf("%s: kernel %s(%v), .maxntid %d: want wc_quant of 9 parameters, .maxntid %d", ks[i].file, k.name, k.params, k.maxntid, quantThreads)
		}
		ks[i].k = k
	}
	return ks
}

// runQuantPTX quantizes w range by range through the kernel and returns
// the codes and scales (as bytes) it wrote.
func runQuantPTX(t *testing.T, k *ptxKernel, w quantCheckWeight) (codes, scales []byte) {
	t.Helper()
	return runQuantPTXAt(t, k, w, 0, 0)
}

// runQuantPTXAt is runQuantPTX with the weight srcOff bytes and the codes
// dstOff bytes past their regions' aligned addresses.
func runQuantPTXAt(t *testing.T, k *ptxKernel, w quantCheckWeight, srcOff, dstOff uint64) (codes, scales []byte) {
	t.Helper()
	nbr, nbc := quant.ScaleShape(int64(w.rows), int64(w.cols))
	codes = bytes.Repeat([]byte{0xA5}, w.rows*w.cols)
	scales = bytes.Repeat([]byte{0xA5}, int(4*nbr*nbc))
	for _, r := range w.ranges {
		j := QuantJob{Src: ptxQuantSrc + srcOff, From: w.from, Rows: int64(w.rows), Cols: int64(w.cols), First: r[0], End: r[1],
			Dst: ptxQuantDst + dstOff + uint64(r[0]), Scales: ptxQuantScales}
		if err := checkQuantJob(j); err != nil {
			t.Fatal(err)
		}
		err := quantLaunches(j, func(blocks int, args []uint64) error {
			mem := &ptxMemory{}
			mem.addRegion(ptxQuantSrc+srcOff, w.src, true, "weight")
			if r[1] > r[0] {
				mem.add(ptxQuantDst+dstOff+uint64(r[0]), codes[r[0]:r[1]])
			}
			mem.add(ptxQuantScales, scales)
			return k.run(mem, blocks, quantThreads, args...)
		})
		if err != nil {
			t.Fatalf("%s [%d, %d], elements [%d, %d): %v", w.from, w.rows, w.cols, r[0], r[1], err)
		}
	}
	return codes, scales
}

// checkQuantPTX runs w through the kernel and compares it with package
// quant.
func checkQuantPTX(t *testing.T, k *ptxKernel, w quantCheckWeight) {
	t.Helper()
	codes, scales := runQuantPTX(t, k, w)
	wantCodes, wantScales, err := w.want()
	if err != nil {
		t.Fatal(err)
	}
	if err := compareQuant(w, codes, scales, wantCodes, wantScales); err != nil {
		t.Fatal(err)
	}
}

// randomRanges cuts n elements into a few ranges at random points (some
// inside blocks and rows, some empty).
func randomRanges(rng *rand.Rand, n int64, pieces int) [][2]int64 {
	cuts := []int64{0, n}
	for range pieces - 1 {
		cuts = append(cuts, rng.Int64N(n+1))
	}
	for i := 1; i < len(cuts); i++ { // insertion sort: a few cuts
		for j := i; j > 0 && cuts[j] < cuts[j-1]; j-- {
			cuts[j], cuts[j-1] = cuts[j-1], cuts[j]
		}
	}
	var r [][2]int64
	for i := range len(cuts) - 1 {
		r = append(r, [2]int64{cuts[i], cuts[i+1]})
	}
	return r
}

// TestQuantPTX quantizes, in the interpreter, the device self-test's
// weights and larger ones of each dtype whose nine kinds of blocks
// (QuantTestWeight: random values, ties, NaNs, infinities, zeros, tiny
// scales, the dtype's largest values, the encoder's whole range, random
// bits) include partial edge blocks in both directions, in ranges that
// split blocks and rows at random elements, and compares every code and
// scale with package quant.
func TestQuantPTX(t *testing.T) {
	skipUnderRace(t)
	for _, kk := range quantPTXKernels(t) {
		k := kk.k
		for _, w := range quantCheckWeights() {
			checkQuantPTX(t, k, w)
		}
		rng := rand.New(rand.NewPCG(23, 7))
		for _, c := range []struct {
			from       dtype.DType
			rows, cols int
		}{
			{dtype.BF16, 384, 260}, // nine kinds, partial column blocks
			{dtype.F16, 257, 300},  // partial row blocks
			{dtype.F32, 2, 1920},   // fifteen blocks in a row: both tiny-scale kinds
			{dtype.BF16, 3, 1},
			{dtype.F32, 1, 129},
		} {
			w := quantCheckWeight{from: c.from, rows: c.rows, cols: c.cols, src: QuantTestWeight(rng, c.from, c.rows, c.cols)}
			w.ranges = randomRanges(rng, int64(c.rows*c.cols), 4)
			checkQuantPTX(t, k, w)
			t.Logf("%s: %s [%d, %d] in ranges %v: codes and scales as package quant's", kk.file, c.from, c.rows, c.cols, w.ranges)
		}
	}
}

// TestQuantPTXVector checks the vector path (full blocks of BF16 and F16
// with rows 16-byte aligned: 16-byte loads, 8-byte stores of codes where
// a whole block lies in the range, byte stores where a range splits it)
// of both kernels against package quant on every kind of block, and that
// it is the path taken: with the codes 8-byte misaligned relative to the
// range, no vector store; with the weight misaligned, no vector load (the
// scalar path), the same bytes each time. In quant.ptx a full block whose
// scale lies below 2^-90 goes on to the scalar path (its element loads):
// the weight of 18 full blocks has one.
func TestQuantPTXVector(t *testing.T) {
	skipUnderRace(t)
	for _, kk := range quantPTXKernels(t) {
		testQuantPTXVector(t, kk.file, kk.conv, kk.k)
	}
}

func testQuantPTXVector(t *testing.T, file string, conv bool, k *ptxKernel) {
	rng := rand.New(rand.NewPCG(23, 8))
	for _, c := range []struct {
		from       dtype.DType
		rows, cols int
		srcOff     uint64
		dstOff     uint64
		loads      bool // vector loads expected
		stores     bool // vector stores expected
	}{
		{dtype.BF16, 384, 384, 0, 0, true, true}, // nine full blocks, one of each kind
		{dtype.F16, 384, 384, 0, 0, true, true},
		{dtype.BF16, 260, 392, 0, 0, true, true}, // partial edge blocks: scalar there
		{dtype.BF16, 384, 384, 0, 3, true, false},
		{dtype.F16, 384, 384, 2, 0, false, false},
		{dtype.BF16, 256, 260, 0, 0, false, false}, // rows not 16-byte aligned
		{dtype.BF16, 256, 1152, 0, 0, true, true},  // 18 full blocks: both tiny-scale kinds
	} {
		w := quantCheckWeight{from: c.from, rows: c.rows, cols: c.cols, src: QuantTestWeight(rng, c.from, c.rows, c.cols)}
		n := int64(c.rows * c.cols)
		// Whole block rows (vector stores), a range splitting one (byte
		// stores), and random cuts.
		w.ranges = [][2]int64{{0, 128 * int64(c.cols)}, {128 * int64(c.cols), 128*int64(c.cols) + 1}}
		for _, r := range randomRanges(rng, n-w.ranges[1][1], 3) {
			w.ranges = append(w.ranges, [2]int64{r[0] + w.ranges[1][1], r[1] + w.ranges[1][1]})
		}
		k.resetCounts()
		codes, scales := runQuantPTXAt(t, k, w, c.srcOff, c.dstOff)
		wantCodes, wantScales, err := w.want()
		if err != nil {
			t.Fatal(err)
		}
		if err := compareQuant(w, codes, scales, wantCodes, wantScales); err != nil {
			t.Fatalf("weight at +%d, codes at +%d: %v", c.srcOff, c.dstOff, err)
		}
		loads, stores := k.executed("ld.global.nc.v4.u32"), k.executed("st.global.v2.u32")
		if (loads > 0) != c.loads || (stores > 0) != c.stores {
			t.Fatalf("%s: %s [%d, %d], weight at +%d, codes at +%d: %d vector loads, %d vector stores", file, c.from, c.rows, c.cols, c.srcOff, c.dstOff, loads, stores)
		}
		scalar := k.executed("ld.global.u16")
		if tiny := slices.ContainsFunc(wantScales, func(s uint32) bool { return s < 0x12800000 }); c.loads && c.rows%128 == 0 && c.cols%128 == 0 &&
			(scalar > 0) != (conv && tiny) {
			t.Fatalf("%s: %s [%d, %d] of full blocks (a scale below 2^-90: %v): %d scalar loads", file, c.from, c.rows, c.cols, tiny, scalar)
		}
		t.Logf("%s: %s [%d, %d], weight at +%d, codes at +%d, ranges %v: %d vector loads, %d vector stores, %d scalar loads, codes and scales as package quant's",
			file, c.from, c.rows, c.cols, c.srcOff, c.dstOff, w.ranges, loads, stores, scalar)
	}
}

// TestQuantPTXScalesOnly checks a launch with an empty range: every
// block's scale, no code written (the codes region is not even mapped).
func TestQuantPTXScalesOnly(t *testing.T) {
	for _, kk := range quantPTXKernels(t) {
		rng := rand.New(rand.NewPCG(5, 5))
		w := quantCheckWeight{from: dtype.BF16, rows: 256, cols: 384, src: QuantTestWeight(rng, dtype.BF16, 256, 384), ranges: [][2]int64{{0, 0}}}
		_, scales := runQuantPTX(t, kk.k, w)
		_, wantScales, err := w.want()
		if err != nil {
			t.Fatal(err)
		}
		if err := compareQuant(w, nil, scales, nil, wantScales); err != nil {
			t.Fatalf("%s: %v", kk.file, err)
		}
	}
}

// TestQuantTestWeight checks that the test weights hold what the kernel's
// tests rely on: blocks whose scale is NaN (a NaN or an infinity), 1
// (zeros or tiny values, and amax 448), and others; codes that are NaN,
// zero of both signs, subnormal, normal and ±448. (0xFF, the negative
// NaN code, needs a quotient past -464, which no block's scale gives.)
func TestQuantTestWeight(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, from := range []dtype.DType{dtype.BF16, dtype.F16, dtype.F32} {
		w := quantCheckWeight{from: from, rows: 384, cols: 384, src: QuantTestWeight(rng, from, 384, 384)}
		codes, scales, err := w.want()
		if err != nil {
			t.Fatal(err)
		}
		var nan, one, other int
		for _, s := range scales {
			switch s {
			case quant.NaNScale:
				nan++
			case 0x3F800000:
				one++
			default:
				other++
			}
		}
		if nan < 2 || one < 2 || other < 2 {
			t.Errorf("%s: %d NaN, %d unit and %d other scales", from, nan, one, other)
		}
		seen := map[byte]bool{}
		for _, c := range codes {
			seen[c] = true
		}
		for _, c := range []byte{0x7F, 0x00, 0x80, 0x01, 0x81, 0x07, 0x08, 0x40, 0x7E, 0xFE} {
			if !seen[c] {
				t.Errorf("%s: no element has code %#02x", from, c)
			}
		}
	}
}

// TestQuantLaunches checks how Queue cuts a job into launches: the block
// rows of its range (all of them for an empty range), at most
// quantMaxGrid thread blocks each, with the kernel's arguments.
func TestQuantLaunches(t *testing.T) {
	type launch struct {
		blocks int
		br0    uint64
	}
	collect := func(j QuantJob) []launch {
		var ls []launch
		if err := quantLaunches(j, func(blocks int, args []uint64) error {
			if len(args) != 9 || args[0] != j.Src || args[1] != j.Dst || args[2] != j.Scales || args[3] != uint64(j.First) ||
				args[4] != uint64(j.End) || args[5] != uint64(j.Rows) || args[6] != uint64(j.Cols) || args[8] != quantKind(j.From) {
				t.Fatalf("%+v: arguments %v", j, args)
			}
			ls = append(ls, launch{blocks, args[7]})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return ls
	}
	j := QuantJob{Src: 1 << 40, From: dtype.BF16, Rows: 300, Cols: 260, Dst: 2 << 40, Scales: 3 << 40}
	for _, c := range []struct {
		first, end int64
		want       []launch
	}{
		{0, 0, []launch{{9, 0}}},                     // scales only: 3 block rows of 3
		{0, 300 * 260, []launch{{9, 0}}},             // everything
		{128*260 - 1, 128*260 + 1, []launch{{6, 0}}}, // across a block row's end
		{129 * 260, 130 * 260, []launch{{3, 1}}},
		{299 * 260, 300 * 260, []launch{{3, 2}}},
	} {
		j.First, j.End = c.first, c.end
		if got := collect(j); !slices.Equal(got, c.want) {
			t.Errorf("elements [%d, %d): launches %v, want %v", c.first, c.end, got, c.want)
		}
	}
	// 2^21 block rows of 2^10 blocks: two launches of 2^30.
	big := QuantJob{Src: 1 << 40, From: dtype.F32, Rows: 128 << 21, Cols: 128 << 10, Dst: 1 << 62, Scales: 1 << 61}
	big.End = big.Rows * big.Cols
	if err := checkQuantJob(big); err != nil {
		t.Fatal(err)
	}
	if got, want := collect(big), []launch{{1 << 30, 0}, {1 << 30, 1 << 20}}; !slices.Equal(got, want) {
		t.Errorf("a [%d, %d] weight: launches %v, want %v", big.Rows, big.Cols, got, want)
	}
}

// TestQuantJobRefused checks Queue's checks of a job: dtypes, shapes,
// ranges, alignment, zero addresses, overlaps; and a Quantizer without
// its kernel or closed.
func TestQuantJobRefused(t *testing.T) {
	ok := QuantJob{Src: 1 << 40, From: dtype.BF16, Rows: 300, Cols: 260, First: 0, End: 300 * 260, Dst: 2 << 40, Scales: 3 << 40}
	if err := checkQuantJob(ok); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		edit func(*QuantJob)
		want string
	}{
		"F8 source":        {func(j *QuantJob) { j.From = dtype.F8E4M3 }, "cannot quantize F8_E4M3"},
		"no rows":          {func(j *QuantJob) { j.Rows = 0 }, "rows and columns"},
		"too many columns": {func(j *QuantJob) { j.Cols = 1 << 31 }, "rows and columns"},
		"range past end":   {func(j *QuantJob) { j.End++ }, "elements [0, 78001)"},
		"range reversed":   {func(j *QuantJob) { j.First = 10; j.End = 5 }, "elements [10, 5)"},
		"misaligned src":   {func(j *QuantJob) { j.Src++ }, "aligned to its 2-byte elements"},
		"zero scales":      {func(j *QuantJob) { j.Scales = 0 }, "scales address"},
		"zero codes":       {func(j *QuantJob) { j.Dst = 0 }, "codes address 0"},
		"codes on weight":  {func(j *QuantJob) { j.Dst = j.Src + 100 }, "must not overlap"},
		"scales on codes":  {func(j *QuantJob) { j.Scales = j.Dst + 4000 }, "must not overlap"},
		"overflow":         {func(j *QuantJob) { j.Src = 1<<64 - 2 }, "overflows"},
	} {
		j := ok
		c.edit(&j)
		if err := checkQuantJob(j); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
	s := &Stream{d: &CUDADevice{}}
	off := &Quantizer{s: s, why: ErrNoQuantKernel}
	if err := off.Queue(ok); err == nil || !strings.Contains(err.Error(), "unavailable") {
		t.Errorf("Queue without a kernel: %v", err)
	}
	closed := &Quantizer{s: s, k: &loadedKernel{}}
	closed.Close(context.Background())
	if err := closed.Queue(ok); err == nil || !strings.Contains(err.Error(), "after Close") {
		t.Errorf("Queue after Close: %v", err)
	}
}
