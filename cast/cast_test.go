package cast

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

func TestF32ToBF16Table(t *testing.T) {
	cases := []struct {
		name string
		in   uint32
		want uint16
	}{
		{"one", 0x3F800000, 0x3F80},
		{"-one", 0xBF800000, 0xBF80},
		{"+0", 0x00000000, 0x0000},
		{"-0", 0x80000000, 0x8000},
		{"below half", 0x3F807FFF, 0x3F80},
		{"tie to even, down", 0x3F808000, 0x3F80},
		{"tie to even, up", 0x3F818000, 0x3F82},
		{"above half", 0x3F808001, 0x3F81},
		{"negative tie to even, up", 0xBF818000, 0xBF82},
		{"max finite bf16 stays", 0x7F7F0000, 0x7F7F},
		{"below overflow midpoint", 0x7F7F7FFF, 0x7F7F},
		{"overflow tie to even is Inf", 0x7F7F8000, 0x7F80},
		{"max finite f32 to Inf", 0x7F7FFFFF, 0x7F80},
		{"-max finite f32 to -Inf", 0xFF7FFFFF, 0xFF80},
		{"+Inf", 0x7F800000, 0x7F80},
		{"-Inf", 0xFF800000, 0xFF80},
		{"quiet NaN", 0x7FC00000, 0x7FC0},
		{"negative NaN", 0xFFC00000, 0x7FC0},
		{"signaling NaN", 0x7F800001, 0x7FC0},
		{"NaN payload", 0x7FC12345, 0x7FC0},
		{"all ones NaN", 0xFFFFFFFF, 0x7FC0},
		{"NaN that would round to Inf", 0x7F807FFF, 0x7FC0},
		{"smallest f32 subnormal", 0x00000001, 0x0000},
		{"subnormal tie to even, down", 0x00008000, 0x0000},
		{"subnormal above half", 0x00008001, 0x0001},
		{"subnormal tie to even, up", 0x00018000, 0x0002},
		{"largest f32 subnormal to min normal", 0x007FFFFF, 0x0080},
		{"negative subnormal", 0x80018000, 0x8002},
	}
	for _, c := range cases {
		if got := F32ToBF16(c.in); got != c.want {
			t.Errorf("%s: F32ToBF16(%#08x) = %#04x, want %#04x", c.name, c.in, got, c.want)
		}
	}
}

func TestF32ToF16Table(t *testing.T) {
	cases := []struct {
		name string
		in   uint32
		want uint16
	}{
		{"one", 0x3F800000, 0x3C00},
		{"-two", 0xC0000000, 0xC000},
		{"+0", 0x00000000, 0x0000},
		{"-0", 0x80000000, 0x8000},
		{"tie to even, down", 0x3F801000, 0x3C00},
		{"tie to even, up", 0x3F803000, 0x3C02},
		{"above half", 0x3F801001, 0x3C01},
		{"below half", 0x3F800FFF, 0x3C00},
		{"max finite 65504", 0x477FE000, 0x7BFF},
		{"just below overflow midpoint", 0x477FEFFF, 0x7BFF},
		{"overflow midpoint 65520 ties to Inf", 0x477FF000, 0x7C00},
		{"-65520 to -Inf", 0xC77FF000, 0xFC00},
		{"1e10 to Inf", 0x501502F9, 0x7C00},
		{"max finite f32 to Inf", 0x7F7FFFFF, 0x7C00},
		{"+Inf", 0x7F800000, 0x7C00},
		{"-Inf", 0xFF800000, 0xFC00},
		{"quiet NaN", 0x7FC00000, 0x7E00},
		{"negative NaN keeps sign", 0xFFC00000, 0xFE00},
		{"signaling NaN", 0x7F800001, 0x7E00},
		{"NaN payload dropped", 0x7FC12345, 0x7E00},
		{"all ones NaN", 0xFFFFFFFF, 0xFE00},
		{"min normal 2^-14", 0x38800000, 0x0400},
		{"largest subnormal", 0x387FC000, 0x03FF},
		{"smallest subnormal 2^-24", 0x33800000, 0x0001},
		{"-smallest subnormal", 0xB3800000, 0x8001},
		{"2^-25 ties to even zero", 0x33000000, 0x0000},
		{"just above 2^-25", 0x33000001, 0x0001},
		{"1.5*2^-24 ties to even 2", 0x33C00000, 0x0002},
		{"2.5*2^-24 ties to even 2", 0x34200000, 0x0002},
		{"subnormal rounds up to min normal", 0x387FF000, 0x0400},
		{"f32 subnormal to zero", 0x00000001, 0x0000},
		{"negative f32 subnormal to -0", 0x807FFFFF, 0x8000},
	}
	for _, c := range cases {
		if got := F32ToF16(c.in); got != c.want {
			t.Errorf("%s: F32ToF16(%#08x) = %#04x, want %#04x", c.name, c.in, got, c.want)
		}
	}
}

func TestCrossTable(t *testing.T) {
	cases := []struct {
		name     string
		fn       func(uint16) uint16
		in, want uint16
	}{
		{"bf16 one to f16", BF16ToF16, 0x3F80, 0x3C00},
		{"bf16 max to f16 Inf", BF16ToF16, 0x7F7F, 0x7C00},
		{"bf16 -Inf", BF16ToF16, 0xFF80, 0xFC00},
		{"bf16 NaN keeps sign", BF16ToF16, 0xFFC1, 0xFE00},
		{"bf16 -0", BF16ToF16, 0x8000, 0x8000},
		{"bf16 2^-24 to smallest f16 subnormal", BF16ToF16, 0x3380, 0x0001},
		{"bf16 tiny to 0", BF16ToF16, 0x3300, 0x0000},
		{"bf16 1+2^-7 exact in f16", BF16ToF16, 0x3F81, 0x3C08},
		{"f16 one to bf16", F16ToBF16, 0x3C00, 0x3F80},
		{"f16 max 65504 rounds to 65536", F16ToBF16, 0x7BFF, 0x4780},
		{"f16 smallest subnormal", F16ToBF16, 0x0001, 0x3380},
		{"f16 tie to even, down: 1+2^-8", F16ToBF16, 0x3C04, 0x3F80},
		{"f16 tie to even, up: 1+3*2^-8", F16ToBF16, 0x3C0C, 0x3F82},
		{"f16 -Inf", F16ToBF16, 0xFC00, 0xFF80},
		{"f16 negative NaN to 0x7FC0", F16ToBF16, 0xFE01, 0x7FC0},
		{"f16 -0", F16ToBF16, 0x8000, 0x8000},
	}
	for _, c := range cases {
		if got := c.fn(c.in); got != c.want {
			t.Errorf("%s: %#04x gave %#04x, want %#04x", c.name, c.in, got, c.want)
		}
	}
}

// f16Value decodes a half independently of the package, as float64.
func f16Value(h uint16) float64 {
	e, m := int(h>>10&0x1F), float64(h&0x3FF)
	var v float64
	switch e {
	case 0:
		v = math.Ldexp(m, -24)
	case 31:
		if m != 0 {
			return math.NaN()
		}
		v = math.Inf(1)
	default:
		v = math.Ldexp(1024+m, e-25)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return v
}

func TestF16RoundTripExhaustive(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		w := F16ToF32(h)
		v := f16Value(h)
		got := float64(math.Float32frombits(w))
		if math.IsNaN(v) {
			if !math.IsNaN(got) || w>>31 != uint32(h>>15) || w&0x1FFF != 0 || (w>>13)&0x3FF != uint32(h&0x3FF) {
				t.Fatalf("F16ToF32(%#04x) = %#08x, want a NaN with the same sign and payload", h, w)
			}
			if back := F32ToF16(w); back != h&0x8000|0x7E00 {
				t.Fatalf("NaN %#04x came back as %#04x", h, back)
			}
			continue
		}
		if got != v || math.Signbit(got) != math.Signbit(v) {
			t.Fatalf("F16ToF32(%#04x) = %v, want %v", h, got, v)
		}
		if back := F32ToF16(w); back != h {
			t.Fatalf("%#04x -> %#08x -> %#04x", h, w, back)
		}
	}
}

func TestBF16RoundTripExhaustive(t *testing.T) {
	for i := range 1 << 16 {
		b := uint16(i)
		back := F32ToBF16(BF16ToF32(b))
		if b&0x7FFF > 0x7F80 {
			if back != 0x7FC0 {
				t.Fatalf("NaN %#04x came back as %#04x", b, back)
			}
			continue
		}
		if back != b {
			t.Fatalf("%#04x came back as %#04x", b, back)
		}
	}
}

// refBF16 rounds by comparing distances to the two neighbours.
func refBF16(u uint32) uint16 {
	if math.IsNaN(float64(math.Float32frombits(u))) {
		return 0x7FC0
	}
	if u&0x7FFFFFFF == 0x7F800000 {
		return uint16(u >> 16)
	}
	x := math.Abs(float64(math.Float32frombits(u)))
	lo := u & 0x7FFF0000
	hi := lo + 0x10000
	vlo := float64(math.Float32frombits(lo))
	vhi := math.Ldexp(1, 128) // the value Inf stands for in rounding
	if hi != 0x7F800000 {
		vhi = float64(math.Float32frombits(hi))
	}
	pick := lo
	switch dl, dh := x-vlo, vhi-x; {
	case dh < dl:
		pick = hi
	case dh == dl && (lo>>16)&1 == 1:
		pick = hi
	}
	return uint16(pick>>16) | uint16(u>>16)&0x8000
}

var f16Table = func() []float64 {
	t := make([]float64, 0x7C01)
	for i := range 0x7C00 {
		t[i] = f16Value(uint16(i))
	}
	t[0x7C00] = 65536 // the value Inf stands for in rounding
	return t
}()

// refF16 rounds by binary search over every finite half.
func refF16(u uint32) uint16 {
	f := math.Float32frombits(u)
	sign := uint16(u>>16) & 0x8000
	if math.IsNaN(float64(f)) {
		return sign | 0x7E00
	}
	x := math.Abs(float64(f))
	if x >= 65536 {
		return sign | 0x7C00
	}
	i := sort.SearchFloat64s(f16Table, x) // first >= x
	if f16Table[i] == x {
		return sign | uint16(i)
	}
	lo, hi := i-1, i
	pick := lo
	switch dl, dh := x-f16Table[lo], f16Table[hi]-x; {
	case dh < dl:
		pick = hi
	case dh == dl && lo&1 == 1:
		pick = hi
	}
	return sign | uint16(pick)
}

func TestAgainstReferenceFormulas(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	n := 1 << 21
	if testing.Short() {
		n = 1 << 16
	}
	for range n {
		u := rng.Uint32()
		if got, want := F32ToBF16(u), refBF16(u); got != want {
			t.Fatalf("F32ToBF16(%#08x) = %#04x, reference %#04x", u, got, want)
		}
		// Exponents around the half range, where F16 rounding is subtle.
		v := u&0x807FFFFF | uint32(96+rng.IntN(50))<<23
		if got, want := F32ToF16(v), refF16(v); got != want {
			t.Fatalf("F32ToF16(%#08x) = %#04x, reference %#04x", v, got, want)
		}
		if got, want := F32ToF16(u), refF16(u); got != want {
			t.Fatalf("F32ToF16(%#08x) = %#04x, reference %#04x", u, got, want)
		}
	}
}

// torchInputs builds the inputs of testdata/torch_golden.py.
func torchInputs() []uint32 {
	var x []uint32
	for i := range uint64(1 << 20) {
		x = append(x, uint32(i*2654435761))
	}
	for h := range uint32(1 << 16) {
		for _, low := range []uint32{0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF} {
			x = append(x, h<<16|low)
		}
	}
	for s := range uint32(2) {
		for e := uint32(96); e < 144; e++ {
			for m := range uint32(1024) {
				for _, low := range []uint32{0, 0xFFF, 0x1000, 0x1001, 0x1FFF} {
					x = append(x, s<<31|e<<23|m<<13|low)
				}
			}
		}
	}
	for e := uint32(98); e < 114; e++ {
		for k := range uint32(1 << 16) {
			for _, low := range []uint32{0, 1} {
				x = append(x, e<<23|k<<7|low)
			}
		}
	}
	return x
}

func digest16(v []uint16) string {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Digests from testdata/torch_golden.py run with torch 2.11.0+cu130: the
// CPU and CUDA results were identical. NaN outputs were set to the c10
// scalar values before hashing (see the package documentation).
const (
	torchInputsSHA256 = "666895574258398bc2cd651bd7f003d19139fad61b5f1b11bddb8e89107d5193"
	torchF32ToBF16    = "48f82e10aeac09584de047808f57e68db3bd2e59fbf7fede7efbe244c1d4998e"
	torchF32ToF16     = "c1617384d15987fc7555f5b1f212a23d5e4e6d0341ba5436b909ae08903b36c4"
	torchF16ToBF16    = "37de2c9beecc2633296c26c38c769266445dbdb118bf655d177cddbd3e73914c"
	torchBF16ToF16    = "dae5a613a981e5c814eefb07939198b101c763bbbea2c9e7953752869ba0c6b2"
)

func TestMatchesTorch(t *testing.T) {
	x := torchInputs()
	raw := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(raw[4*i:], v)
	}
	if s := sha256.Sum256(raw); hex.EncodeToString(s[:]) != torchInputsSHA256 || len(x) != 3964928 {
		t.Fatalf("the inputs differ from the script's (%d values)", len(x))
	}
	conv := func(dstType dtype.DType, src []byte, srcType dtype.DType) []uint16 {
		dst := make([]byte, len(src)/srcType.Size()*dstType.Size())
		if err := Convert(dst, dstType, src, srcType); err != nil {
			t.Fatal(err)
		}
		out := make([]uint16, len(dst)/2)
		for i := range out {
			out[i] = binary.LittleEndian.Uint16(dst[2*i:])
		}
		return out
	}
	if got := digest16(conv(dtype.BF16, raw, dtype.F32)); got != torchF32ToBF16 {
		t.Errorf("F32→BF16 digest %s, torch %s", got, torchF32ToBF16)
	}
	if got := digest16(conv(dtype.F16, raw, dtype.F32)); got != torchF32ToF16 {
		t.Errorf("F32→F16 digest %s, torch %s", got, torchF32ToF16)
	}
	all := make([]byte, 2<<16)
	for i := range 1 << 16 {
		binary.LittleEndian.PutUint16(all[2*i:], uint16(i))
	}
	if got := digest16(conv(dtype.BF16, all, dtype.F16)); got != torchF16ToBF16 {
		t.Errorf("F16→BF16 digest %s, torch %s", got, torchF16ToBF16)
	}
	if got := digest16(conv(dtype.F16, all, dtype.BF16)); got != torchBF16ToF16 {
		t.Errorf("BF16→F16 digest %s, torch %s", got, torchBF16ToF16)
	}
}

func TestConvertErrors(t *testing.T) {
	for _, d := range dtype.All() {
		for _, e := range dtype.All() {
			want := (d == e && (d == dtype.F32 || d == dtype.BF16 || d == dtype.F16)) ||
				(d == dtype.F32 && (e == dtype.BF16 || e == dtype.F16)) ||
				(d == dtype.BF16 && (e == dtype.F16 || e == dtype.F32)) ||
				(d == dtype.F16 && (e == dtype.BF16 || e == dtype.F32))
			if Supported(d, e) != want {
				t.Errorf("Supported(%s, %s) = %v", d, e, !want)
			}
			if !want {
				err := Convert(make([]byte, 8*e.Size()), e, make([]byte, 8*d.Size()), d)
				if !errors.Is(err, ErrUnsupported) {
					t.Errorf("Convert %s to %s: %v, want ErrUnsupported", d, e, err)
				}
			}
		}
	}
	if err := Convert(make([]byte, 2), dtype.BF16, make([]byte, 5), dtype.F32); !errors.Is(err, ErrLength) {
		t.Errorf("ragged source: %v", err)
	}
	if err := Convert(make([]byte, 3), dtype.BF16, make([]byte, 8), dtype.F32); !errors.Is(err, ErrLength) {
		t.Errorf("short destination: %v", err)
	}
	if err := Convert(make([]byte, 6), dtype.BF16, make([]byte, 8), dtype.F32); !errors.Is(err, ErrLength) {
		t.Errorf("long destination: %v", err)
	}
	if err := Convert(nil, dtype.F16, nil, dtype.F32); err != nil {
		t.Errorf("empty: %v", err)
	}
}

func TestConvertMatchesElementFunctions(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 3, 4, 5, 17, 1000} {
		src := make([]byte, 4*n)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		bf := make([]byte, 2*n)
		hf := make([]byte, 2*n)
		if err := Convert(bf, dtype.BF16, src, dtype.F32); err != nil {
			t.Fatal(err)
		}
		if err := Convert(hf, dtype.F16, src, dtype.F32); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			u := binary.LittleEndian.Uint32(src[4*i:])
			if got := binary.LittleEndian.Uint16(bf[2*i:]); got != F32ToBF16(u) {
				t.Fatalf("n=%d element %d: bf16 %#04x, want %#04x", n, i, got, F32ToBF16(u))
			}
			if got := binary.LittleEndian.Uint16(hf[2*i:]); got != F32ToF16(u) {
				t.Fatalf("n=%d element %d: f16 %#04x, want %#04x", n, i, got, F32ToF16(u))
			}
		}
		// In place, dst starting at src's first byte.
		in := append([]byte(nil), src...)
		if err := Convert(in[:2*n], dtype.BF16, in, dtype.F32); err != nil {
			t.Fatal(err)
		}
		if string(in[:2*n]) != string(bf) {
			t.Fatalf("n=%d: in-place F32→BF16 differs", n)
		}
		in = append(in[:0], bf...)
		want := make([]byte, 2*n)
		Convert(want, dtype.F16, bf, dtype.BF16)
		if err := Convert(in, dtype.F16, in, dtype.BF16); err != nil || string(in) != string(want) {
			t.Fatalf("n=%d: in-place BF16→F16 differs (%v)", n, err)
		}
		wide := make([]byte, 4*n)
		if err := Convert(wide, dtype.F32, bf, dtype.BF16); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if binary.LittleEndian.Uint32(wide[4*i:]) != BF16ToF32(binary.LittleEndian.Uint16(bf[2*i:])) {
				t.Fatalf("n=%d: BF16→F32 element %d", n, i)
			}
		}
	}
}
