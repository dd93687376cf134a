package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
)

// bf16Weights returns n normal values with standard deviation sd as BF16
// bytes.
func bf16Weights(rng *rand.Rand, n int, sd float64) []byte {
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], cast.F32ToBF16(math.Float32bits(float32(rng.NormFloat64()*sd))))
	}
	return b
}

// wantQuantized quantizes a [rows, cols] weight with package quant.
func wantQuantized(t testing.TB, w []byte, from dtype.DType, rows, cols int) (codes []byte, scales []uint32) {
	t.Helper()
	br, bc := quant.ScaleShape(int64(rows), int64(cols))
	scales = make([]uint32, br*bc)
	codes = make([]byte, rows*cols)
	if err := quant.Scales(scales, w, from, cols); err != nil {
		t.Fatal(err)
	}
	if err := quant.Encode(codes, w, from, cols, 0, scales); err != nil {
		t.Fatal(err)
	}
	return codes, scales
}

func scaleBytes(s []uint32) []byte {
	b := make([]byte, 4*len(s))
	for i, v := range s {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
	return b
}

// TestQuantizeRound sends a model with quantization through small buckets
// (weights split across several, as from several reader goroutines) and
// checks that receivers get the FP8 codes and scales of package quant, the
// other tensors as they were (cast by Cast), and that the dequantized
// weights are within the FP8 rounding bound of the originals.
func TestQuantizeRound(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 1))
	up := bf16Weights(rng, 300*200, 0.02)
	down := bf16Weights(rng, 129*1000, 1)
	f32w := make([]byte, 4*130*70)
	for i := range 130 * 70 {
		binary.LittleEndian.PutUint32(f32w[4*i:], math.Float32bits(float32(rng.NormFloat64())))
	}
	norm := bf16Weights(rng, 200, 1)
	embed := bf16Weights(rng, 64*200, 1)
	f8 := make([]byte, 16*16)
	for i := range f8 {
		f8[i] = byte(i)
	}
	src := tensorList{
		{Name: "model.embed_tokens.weight", DType: dtype.BF16, Shape: []int64{64, 200}, Data: embed},
		{Name: "model.layers.0.mlp.up_proj.weight", DType: dtype.BF16, Shape: []int64{300, 200}, Data: up},
		{Name: "model.layers.0.mlp.down_proj.weight", DType: dtype.BF16, Shape: []int64{129, 1000}, Reader: bytes.NewReader(down)},
		{Name: "model.layers.0.self_attn.q_proj.weight", DType: dtype.F32, Shape: []int64{130, 70}, Data: f32w},
		{Name: "model.layers.0.input_layernorm.weight", DType: dtype.BF16, Shape: []int64{200}, Data: norm},
		{Name: "model.layers.1.mlp.up_proj.weight", DType: dtype.F8E4M3, Shape: []int64{16, 16}, Data: f8},
		{Name: "model.layers.1.mlp.up_proj.weight_scale_inv", DType: dtype.F32, Shape: []int64{1, 1}, Data: scaleBytes([]uint32{0x3F800000})},
	}
	qs, err := Quantize(Cast(src, dtype.F16), QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	for _, bucket := range []int{4 << 10, 1 << 20} {
		g := newGroup(t, groupOpts{world: 3, bucket: bucket, checksum: true})
		models := []*memModel{newMemModel(), newMemModel()}
		if err := g.round(context.Background(), qs, 1, []Sink{models[0], models[1]}); err != nil {
			t.Fatal(err)
		}
		for _, m := range models {
			for _, w := range []struct {
				name       string
				data       []byte
				from       dtype.DType
				rows, cols int
			}{
				{"model.layers.0.mlp.up_proj.weight", up, dtype.BF16, 300, 200},
				{"model.layers.0.mlp.down_proj.weight", down, dtype.BF16, 129, 1000},
				{"model.layers.0.self_attn.q_proj.weight", f32w, dtype.F32, 130, 70},
			} {
				codes, scales := wantQuantized(t, w.data, w.from, w.rows, w.cols)
				got, ok := m.Get(w.name)
				if !ok || got.DType != dtype.F8E4M3 || !slices.Equal(got.Shape, []int64{int64(w.rows), int64(w.cols)}) || !bytes.Equal(got.Data, codes) {
					t.Fatalf("bucket %d: %s: got %v %v, or its codes differ", bucket, w.name, got.DType, got.Shape)
				}
				br, bc := quant.ScaleShape(int64(w.rows), int64(w.cols))
				gs, ok := m.Get(w.name + quant.ScaleSuffix)
				if !ok || gs.DType != dtype.F32 || !slices.Equal(gs.Shape, []int64{br, bc}) || !bytes.Equal(gs.Data, scaleBytes(scales)) {
					t.Fatalf("bucket %d: %s scales: got %v %v, or they differ", bucket, w.name, gs.DType, gs.Shape)
				}
				checkDequantized(t, w.name, got.Data, gs.Data, w.data, w.from, w.rows, w.cols)
			}
			for _, keep := range []struct {
				name string
				typ  dtype.DType
				data []byte
			}{
				{"model.embed_tokens.weight", dtype.F16, convert16(t, embed, dtype.BF16, dtype.F16)},
				{"model.layers.0.input_layernorm.weight", dtype.F16, convert16(t, norm, dtype.BF16, dtype.F16)},
				{"model.layers.1.mlp.up_proj.weight", dtype.F8E4M3, f8},
				{"model.layers.1.mlp.up_proj.weight_scale_inv", dtype.F32, scaleBytes([]uint32{0x3F800000})},
			} {
				got, ok := m.Get(keep.name)
				if !ok || got.DType != keep.typ || !bytes.Equal(got.Data, keep.data) {
					t.Fatalf("%s: got %+v, want %s as it was (cast by Cast)", keep.name, got, keep.typ)
				}
			}
		}
	}
}

// checkDequantized checks that codes × scales is within half an E4M3 step
// (at the scaled magnitude) times the scale of every weight.
func checkDequantized(t *testing.T, name string, codes, scaleBytes, w []byte, from dtype.DType, rows, cols int) {
	t.Helper()
	br, bc := quant.ScaleShape(int64(rows), int64(cols))
	scales := make([]uint32, br*bc)
	for i := range scales {
		scales[i] = binary.LittleEndian.Uint32(scaleBytes[4*i:])
	}
	deq := make([]byte, 4*rows*cols)
	if err := quant.Dequantize(deq, dtype.F32, codes, scales, rows, cols); err != nil {
		t.Fatal(err)
	}
	orig := make([]byte, 4*rows*cols)
	if err := cast.Convert(orig, dtype.F32, w, from); err != nil && from != dtype.F32 {
		t.Fatal(err)
	}
	if from == dtype.F32 {
		copy(orig, w)
	}
	for i := range rows * cols {
		o := float64(math.Float32frombits(binary.LittleEndian.Uint32(orig[4*i:])))
		d := float64(math.Float32frombits(binary.LittleEndian.Uint32(deq[4*i:])))
		s := float64(math.Float32frombits(scales[(i/cols/quant.Block)*int(bc)+(i%cols)/quant.Block]))
		x := math.Abs(o) / s
		step := 0x1p-9
		if x >= 0x1p-6 {
			_, e := math.Frexp(x)
			step = math.Ldexp(1, e-4)
		}
		if math.Abs(d-o) > step/2*s+math.Abs(o)*0x1p-20 {
			t.Fatalf("%s element %d: %g dequantized to %g, beyond the FP8 rounding bound", name, i, o, d)
		}
	}
}

func TestQuantizeErrors(t *testing.T) {
	if _, err := Quantize(tensorList{}, QuantizeConfig{Scheme: "fp4"}); err == nil || !strings.Contains(err.Error(), "fp8-block") {
		t.Errorf("unknown scheme: %v", err)
	}
	if _, err := Quantize(tensorList{}, QuantizeConfig{Include: []string{"x"}}); err == nil {
		t.Error("patterns without a scheme accepted")
	}
	if _, err := Quantize(tensorList{}, QuantizeConfig{Scheme: quant.FP8Block, Exclude: []string{"("}}); err == nil {
		t.Error("a bad pattern accepted")
	}
	src := tensorList{{Name: "model.norm.weight", DType: dtype.BF16, Shape: []int64{8}, Data: make([]byte, 16)}}
	qs, err := Quantize(src, QuantizeConfig{Scheme: quant.FP8Block, Include: []string{`norm`}})
	if err != nil {
		t.Fatal(err)
	}
	g := newGroup(t, groupOpts{world: 2, bucket: 1 << 10})
	err = g.round(context.Background(), qs, 1, []Sink{newMemModel()})
	if err == nil || !strings.Contains(err.Error(), "model.norm.weight") || !strings.Contains(err.Error(), "2-D") {
		t.Fatalf("a 1-D tensor forced by a pattern: %v", err)
	}
	if s, _ := Quantize(src, QuantizeConfig{}); s == nil {
		t.Fatal("no scheme: nil source")
	}
	// A device weight read for host buckets: the GPU quantizes it, into
	// device buckets only.
	dev := tensorList{{Name: "model.layers.0.mlp.up_proj.weight", DType: dtype.BF16, Shape: []int64{4, 8}, Device: fakeDevice{n: 64}}}
	qs, err = Quantize(dev, QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	g = newGroup(t, groupOpts{world: 2, bucket: 1 << 10}) // the first is broken
	err = g.round(context.Background(), qs, 1, []Sink{newMemModel()})
	if err == nil || !strings.Contains(err.Error(), "up_proj") || !strings.Contains(err.Error(), "device buckets") {
		t.Fatalf("a device weight into host buckets: %v", err)
	}
}

// TestQuantizeLookup finds a picked weight's codes and scales, and the
// tensors left as they are, by name through Quantize, with the same bytes
// Tensors gives; over a source that cannot look up (a plain Tensors list,
// by design not a Lookuper) nothing is found, as with Cast.
func TestQuantizeLookup(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 2))
	w := &Tensor{Name: "model.layers.0.mlp.up_proj.weight", DType: dtype.BF16, Shape: []int64{200, 300}, Data: bf16Weights(rng, 200*300, 0.02)}
	norm := &Tensor{Name: "model.layers.0.input_layernorm.weight", DType: dtype.BF16, Shape: []int64{300}, Data: bf16Weights(rng, 300, 1)}
	codes, scales := wantQuantized(t, w.Data, w.DType, 200, 300)
	qs, err := Quantize(listLookup{tensorList{w, norm}}, QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	l := qs.(Lookuper)
	for _, c := range []struct {
		name string
		want []byte
		typ  dtype.DType
	}{
		{w.Name + quant.ScaleSuffix, scaleBytes(scales), dtype.F32},
		{w.Name, codes, dtype.F8E4M3},
		{norm.Name, norm.Data, dtype.BF16},
	} {
		tn, ok := l.Lookup(c.name)
		if !ok {
			t.Fatalf("no %s", c.name)
		}
		size, err := tn.Validate()
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, size)
		if err := tn.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if tn.Name != c.name || tn.DType != c.typ || !bytes.Equal(got, c.want) {
			t.Fatalf("%s: found %s %s%v with other bytes", c.name, tn.Name, tn.DType, tn.Shape)
		}
	}
	for _, name := range []string{"zz", "zz" + quant.ScaleSuffix, norm.Name + quant.ScaleSuffix} {
		if tn, ok := l.Lookup(name); ok {
			t.Fatalf("found %s as %s", name, tn.Name)
		}
	}
	// A plain list cannot look up, so neither can Quantize over it.
	qs, err = Quantize(tensorList{w, norm}, QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := qs.(Lookuper).Lookup(w.Name + quant.ScaleSuffix); ok {
		t.Fatal("found a tensor in a source that cannot look up")
	}
}
