package quant

import (
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

func TestDefaultSelection(t *testing.T) {
	two := []int64{64, 32}
	picked := []string{
		"model.layers.0.self_attn.q_proj.weight",
		"model.layers.0.self_attn.o_proj.weight",
		"model.layers.3.mlp.gate_proj.weight",
		"model.layers.3.mlp.up_proj.weight",
		"model.layers.3.mlp.down_proj.weight",
		"model.layers.3.mlp.experts.7.gate_proj.weight",
		"model.layers.3.mlp.shared_experts.down_proj.weight",
		"model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
		"model.layers.2.block_sparse_moe.experts.0.w1.weight",
		"transformer.h.0.attn.c_attn.weight",
		"layers.0.attention.wq.weight",
	}
	kept := []string{
		"model.embed_tokens.weight",
		"lm_head.weight",
		"model.norm.weight",
		"model.layers.0.input_layernorm.weight",
		"model.layers.0.post_attention_layernorm.weight",
		"model.layers.0.self_attn.q_norm.weight",
		"model.layers.1.self_attn.kv_a_layernorm.weight",
		"model.layers.3.mlp.gate.weight",
		"model.layers.2.block_sparse_moe.gate.weight",
		"model.layers.3.mlp.shared_expert_gate.weight",
		"transformer.wte.weight",
		"transformer.wpe.weight",
		"transformer.h.0.ln_1.weight",
		"model.layers.0.self_attn.q_proj.bias",
		"model.layers.3.mlp.gate.e_score_correction_bias",
		"score.weight",
	}
	for _, n := range picked {
		if !Default(n, dtype.BF16, two) {
			t.Errorf("%s: not picked by default", n)
		}
	}
	for _, n := range kept {
		if Default(n, dtype.BF16, two) {
			t.Errorf("%s: picked by default", n)
		}
	}
	if Default("model.layers.0.mlp.up_proj.weight", dtype.BF16, []int64{64}) {
		t.Error("a 1-D weight picked")
	}
	if Default("model.layers.0.mlp.up_proj.weight", dtype.I8, two) || Default("model.layers.0.mlp.up_proj.weight", dtype.F8E4M3, two) {
		t.Error("an I8 or FP8 weight picked")
	}
}

func TestSelectorPatterns(t *testing.T) {
	s, err := NewSelector([]string{`lm_head\.weight$`, `\.norm\.weight$`, `foo`}, []string{`\.layers\.0\.`})
	if err != nil {
		t.Fatal(err)
	}
	two := []int64{256, 128}
	for _, c := range []struct {
		name string
		d    dtype.DType
		sh   []int64
		want bool
		err  string
	}{
		{"lm_head.weight", dtype.BF16, two, true, ""},
		{"model.layers.0.mlp.up_proj.weight", dtype.BF16, two, false, ""}, // excluded wins
		{"model.layers.1.mlp.up_proj.weight", dtype.BF16, two, true, ""},  // default
		{"model.norm.weight", dtype.BF16, []int64{128}, false, "2-D"},     // forced 1-D
		{"foo.i", dtype.I32, two, false, "I32"},
		{"foo.f8", dtype.F8E4M3, two, false, ""}, // FP8 passes as it is
	} {
		got, err := s.Select(c.name, c.d, c.sh)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), c.name) {
				t.Errorf("%s: error %v, want one naming it and %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := NewSelector([]string{"("}, nil); err == nil {
		t.Error("a bad pattern compiled")
	}
	if _, err := ParseScheme("fp4"); err == nil || !strings.Contains(err.Error(), "fp8-block") {
		t.Errorf("unknown scheme: %v", err)
	}
	if sc, err := ParseScheme("FP8-Block"); err != nil || sc != FP8Block {
		t.Errorf("fp8-block: %v %v", sc, err)
	}
}
