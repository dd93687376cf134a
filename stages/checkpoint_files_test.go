package stages_test

import (
	"bytes"
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/safetensors"
	"github.com/weightcast/weightcast/safetensors/safetensorstest"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
)

// Cast and Quantize between a source.Checkpoint and sink.WriteSafetensors:
// the files the receivers write carry the converted tensors.

func TestCastCheckpoint(t *testing.T) {
	src := t.TempDir()
	data := safetensorstest.Write(t, src, 11, safetensorstest.CastShards(), true)
	ckpt, err := source.OpenCheckpoint(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	srcTypes := map[string]dtype.DType{}
	for _, sh := range safetensorstest.CastShards() {
		for _, s := range sh {
			srcTypes[s.Name] = s.DType
		}
	}
	for _, to := range []dtype.DType{dtype.BF16, dtype.F16} {
		for _, bucket := range []int{4 << 10, 1 << 20} {
			t.Run(fmt.Sprintf("%s/bucket=%d", to, bucket), func(t *testing.T) {
				outs := safetensorstest.OutDirs(t, 3)
				stagestest.WriteRounds(t, stages.Cast(ckpt, to), bucket, outs, 1)
				for _, o := range outs {
					m, err := safetensors.OpenModel(o)
					if err != nil {
						t.Fatalf("the package reader refuses the cast checkpoint: %v", err)
					}
					if got := m.Index().Metadata["note"]; got != safetensorstest.IndexNote {
						t.Fatalf("index metadata note %v", got)
					}
					m.Close()
					n := 0
					for _, f := range safetensorstest.DirFiles(t, o) {
						if !strings.HasSuffix(f, ".safetensors") {
							continue
						}
						meta, tensors := safetensorstest.ReadRaw(t, filepath.Join(o, f))
						if !maps.Equal(meta, safetensorstest.Meta) {
							t.Fatalf("%s: metadata %v", f, meta)
						}
						for name, mt := range tensors {
							n++
							from := srcTypes[name]
							want, wantType := data[name], from
							if stages.Castable(from, to) {
								want, wantType = stages.Convert16(t, data[name], from, to), to
							}
							if mt.DType != wantType.String() || !bytes.Equal(mt.Data, want) {
								t.Fatalf("%s: tensor %s is %s of %d bytes, want %s of %d bytes (source %s), or its values differ",
									f, name, mt.DType, len(mt.Data), wantType, len(want), from)
							}
						}
					}
					if n != len(data) {
						t.Fatalf("%s holds %d tensors, want %d", o, n, len(data))
					}
				}
			})
		}
	}
}

// TestQuantizeCheckpoint writes a quantized checkpoint through the
// safetensors sink: the files list each picked weight as F8_E4M3 with its
// F32 scales next to it, and read back as package quant computes them.
func TestQuantizeCheckpoint(t *testing.T) {
	dir := t.TempDir()
	shards := [][]safetensorstest.Spec{
		{
			{Name: "model.embed_tokens.weight", DType: dtype.BF16, Shape: []int64{50, 64}},
			{Name: "model.layers.0.self_attn.o_proj.weight", DType: dtype.BF16, Shape: []int64{200, 130}},
			{Name: "model.norm.weight", DType: dtype.BF16, Shape: []int64{64}},
		},
		{
			{Name: "model.layers.0.mlp.gate_proj.weight", DType: dtype.F16, Shape: []int64{64, 300}},
			{Name: "lm_head.weight", DType: dtype.BF16, Shape: []int64{50, 64}},
		},
	}
	data := safetensorstest.Write(t, dir, 5, shards, true)
	ckpt, err := source.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	qs, err := stages.Quantize(ckpt, stages.QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	outs := safetensorstest.OutDirs(t, 2)
	stagestest.WriteRounds(t, qs, 8<<10, outs, 1)
	for _, o := range outs {
		m, err := safetensors.OpenModel(o)
		if err != nil {
			t.Fatalf("the package reader refuses the quantized checkpoint: %v", err)
		}
		m.Close()
		found := map[string]*safetensorstest.RawTensor{}
		for _, f := range safetensorstest.DirFiles(t, o) {
			if strings.HasSuffix(f, ".safetensors") {
				_, ts := safetensorstest.ReadRaw(t, filepath.Join(o, f))
				for k, v := range ts {
					found[k] = v
				}
			}
		}
		for _, sh := range shards {
			for _, s := range sh {
				got := found[s.Name]
				if !quant.Default(s.Name, s.DType, s.Shape) {
					if got == nil || got.DType != s.DType.String() || !bytes.Equal(got.Data, data[s.Name]) {
						t.Fatalf("%s: %+v, want it as it was", s.Name, got)
					}
					continue
				}
				rows, cols := int(s.Shape[0]), int(s.Shape[1])
				codes, scales := stages.WantQuantized(t, data[s.Name], s.DType, rows, cols)
				sc := found[s.Name+quant.ScaleSuffix]
				if got == nil || got.DType != "F8_E4M3" || !bytes.Equal(got.Data, codes) || sc == nil || sc.DType != "F32" || !bytes.Equal(sc.Data, stages.ScaleBytes(scales)) {
					t.Fatalf("%s: codes or scales missing or different", s.Name)
				}
			}
		}
		if len(found) != 7 {
			t.Fatalf("%d tensors written, want 5 and 2 scales", len(found))
		}
	}
}
