package layout

import (
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

// want is a shard written by hand from vLLM's loaders: the dim-0 and dim-1
// ranges [lo, hi) a rank loads.
type want struct {
	name  string
	shape []int64
	c     Coord
	slice string // "" for not needed
}

func checkNeeds(t *testing.T, m Model, cases []want) {
	t.Helper()
	rules := DefaultRules()
	for _, w := range cases {
		k, err := rules.Kind(w.name)
		if err != nil {
			t.Errorf("%s: %v", w.name, err)
			continue
		}
		s, ok, err := k.Need(Tensor{Name: w.name, DType: dtype.BF16, Shape: w.shape}, w.c, m)
		if err != nil {
			t.Errorf("%s: %v", w.name, err)
			continue
		}
		got := ""
		if ok {
			got = s.String()
		}
		if got != w.slice {
			t.Errorf("%s %v at %+v (kind %v): got %q, want %q", w.name, w.shape, w.c, k, got, w.slice)
		}
	}
}

func tp(r, n int) Coord { return Coord{TPRank: r, TPSize: n} }

// TestRulesLlama: Llama-3-8B (hidden 4096, 32 heads, 8 kv heads, head dim
// 128, intermediate 14336, vocab 128256).
func TestRulesLlama(t *testing.T) {
	L := "model.layers.7."
	checkNeeds(t, Model{Heads: 32, KVHeads: 8}, []want{
		{L + "self_attn.q_proj.weight", []int64{4096, 4096}, tp(3, 8), "[1536:2048, 0:4096]"},
		// 8 kv heads over 8 ranks: one head (128 rows) each.
		{L + "self_attn.k_proj.weight", []int64{1024, 4096}, tp(3, 8), "[384:512, 0:4096]"},
		// over 16 ranks: 2 ranks per head, rank 5 takes head 5/2 = 2.
		{L + "self_attn.v_proj.weight", []int64{1024, 4096}, tp(5, 16), "[256:384, 0:4096]"},
		{L + "self_attn.v_proj.weight", []int64{1024, 4096}, tp(1, 2), "[512:1024, 0:4096]"},
		{L + "self_attn.o_proj.weight", []int64{4096, 4096}, tp(3, 8), "[0:4096, 1536:2048]"},
		{L + "mlp.gate_proj.weight", []int64{14336, 4096}, tp(3, 8), "[5376:7168, 0:4096]"},
		{L + "mlp.up_proj.weight", []int64{14336, 4096}, tp(0, 8), "[0:1792, 0:4096]"},
		{L + "mlp.down_proj.weight", []int64{4096, 14336}, tp(3, 8), "[0:4096, 5376:7168]"},
		{L + "input_layernorm.weight", []int64{4096}, tp(3, 8), "[0:4096]"},
		{L + "post_attention_layernorm.weight", []int64{4096}, tp(3, 8), "[0:4096]"},
		{"model.norm.weight", []int64{4096}, tp(3, 8), "[0:4096]"},
		// 128256 is a multiple of 64: 16032 rows per rank.
		{"model.embed_tokens.weight", []int64{128256, 4096}, tp(3, 8), "[48096:64128, 0:4096]"},
		{"lm_head.weight", []int64{128256, 4096}, tp(7, 8), "[112224:128256, 0:4096]"},
		// 32001 pads to 32064, 8016 per rank; the last keeps the real rows.
		{"lm_head.weight", []int64{32001, 4096}, tp(3, 4), "[24048:32001, 0:4096]"},
		{"model.embed_tokens.weight", []int64{32001, 4096}, tp(2, 4), "[16032:24048, 0:4096]"},
		{L + "self_attn.rotary_emb.inv_freq", []int64{64}, tp(0, 8), ""},
		// No TP: whole tensors.
		{L + "self_attn.k_proj.weight", []int64{1024, 4096}, Coord{}, "[0:1024, 0:4096]"},
	})
}

// TestRulesQwen: Qwen2.5-7B (hidden 3584, 28 heads, 4 kv heads, biases on
// q/k/v) and Qwen3 (q_norm, k_norm) and Qwen MoE names.
func TestRulesQwen(t *testing.T) {
	L := "model.layers.0."
	checkNeeds(t, Model{Heads: 28, KVHeads: 4, Experts: 64}, []want{
		{L + "self_attn.q_proj.bias", []int64{3584}, tp(1, 4), "[896:1792]"},
		{L + "self_attn.k_proj.bias", []int64{512}, tp(2, 4), "[256:384]"},
		{L + "self_attn.k_proj.weight", []int64{512, 3584}, tp(2, 4), "[256:384, 0:3584]"},
		{L + "self_attn.o_proj.weight", []int64{3584, 3584}, tp(1, 4), "[0:3584, 896:1792]"},
		{L + "self_attn.q_norm.weight", []int64{128}, tp(1, 4), "[0:128]"},
		{L + "self_attn.k_norm.weight", []int64{128}, tp(1, 4), "[0:128]"},
		{L + "mlp.experts.5.gate_proj.weight", []int64{1408, 2048}, tp(1, 4), "[352:704, 0:2048]"},
		{L + "mlp.experts.5.down_proj.weight", []int64{2048, 1408}, tp(1, 4), "[0:2048, 352:704]"},
		{L + "mlp.shared_expert.up_proj.weight", []int64{5632, 2048}, tp(3, 4), "[4224:5632, 0:2048]"},
		{L + "mlp.shared_expert_gate.weight", []int64{1, 2048}, tp(3, 4), "[0:1, 0:2048]"},
		{L + "mlp.gate.weight", []int64{64, 2048}, tp(3, 4), "[0:64, 0:2048]"},
		// EP 4 of 64 experts: 16 each, expert 5 on EP rank 0 only.
		{L + "mlp.experts.5.gate_proj.weight", []int64{1408, 2048}, Coord{TPSize: 1, EPRank: 0, EPSize: 4}, "[0:1408, 0:2048]"},
		{L + "mlp.experts.5.gate_proj.weight", []int64{1408, 2048}, Coord{TPSize: 1, EPRank: 1, EPSize: 4}, ""},
	})
	// 28 heads do not split over 8 ranks: vLLM refuses, so do the rules.
	k, _ := DefaultRules().Kind(L + "self_attn.q_proj.weight")
	if _, _, err := k.Need(Tensor{Name: "q", DType: dtype.BF16, Shape: []int64{3584, 3584}}, tp(0, 8), Model{Heads: 28, KVHeads: 4}); err == nil || !strings.Contains(err.Error(), "28 query heads") {
		t.Errorf("28 heads over 8 ranks: %v", err)
	}
}

// TestRulesDeepSeek: DeepSeek-V3 (hidden 7168, 128 heads, q_lora_rank 1536,
// kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, 256 experts of
// intermediate 2048) at TP 8, and its experts at EP 8.
func TestRulesDeepSeek(t *testing.T) {
	L := "model.layers.5."
	checkNeeds(t, Model{Heads: 128, KVHeads: 128, Experts: 256}, []want{
		{L + "self_attn.q_a_proj.weight", []int64{1536, 7168}, tp(3, 8), "[0:1536, 0:7168]"},
		{L + "self_attn.q_a_layernorm.weight", []int64{1536}, tp(3, 8), "[0:1536]"},
		{L + "self_attn.q_b_proj.weight", []int64{24576, 1536}, tp(3, 8), "[9216:12288, 0:1536]"},
		{L + "self_attn.kv_a_proj_with_mqa.weight", []int64{576, 7168}, tp(3, 8), "[0:576, 0:7168]"},
		{L + "self_attn.kv_a_layernorm.weight", []int64{512}, tp(3, 8), "[0:512]"},
		{L + "self_attn.kv_b_proj.weight", []int64{32768, 512}, tp(3, 8), "[12288:16384, 0:512]"},
		{L + "self_attn.o_proj.weight", []int64{7168, 16384}, tp(3, 8), "[0:7168, 6144:8192]"},
		{L + "mlp.gate.weight", []int64{256, 7168}, tp(3, 8), "[0:256, 0:7168]"},
		{L + "mlp.gate.e_score_correction_bias", []int64{256}, tp(3, 8), "[0:256]"},
		{L + "mlp.shared_experts.gate_proj.weight", []int64{2048, 7168}, tp(3, 8), "[768:1024, 0:7168]"},
		{L + "mlp.shared_experts.down_proj.weight", []int64{7168, 2048}, tp(3, 8), "[0:7168, 768:1024]"},
		{L + "mlp.experts.17.gate_proj.weight", []int64{2048, 7168}, tp(3, 8), "[768:1024, 0:7168]"},
		{L + "mlp.experts.17.down_proj.weight", []int64{7168, 2048}, tp(3, 8), "[0:7168, 768:1024]"},
		// EP 8: 32 experts per rank, 17 on rank 0, 255 on rank 7.
		{L + "mlp.experts.17.up_proj.weight", []int64{2048, 7168}, Coord{TPRank: 0, TPSize: 8, EPRank: 0, EPSize: 8}, "[0:2048, 0:7168]"},
		{L + "mlp.experts.17.up_proj.weight", []int64{2048, 7168}, Coord{TPRank: 1, TPSize: 8, EPRank: 1, EPSize: 8}, ""},
		{L + "mlp.experts.255.down_proj.weight", []int64{7168, 2048}, Coord{TPRank: 7, TPSize: 8, EPRank: 7, EPSize: 8}, "[0:7168, 0:2048]"},
		// Dense layers and MLA without q_lora (DeepSeek-V2-Lite's q_proj: heads × 192 rows).
		{"model.layers.0.mlp.gate_proj.weight", []int64{18432, 7168}, tp(3, 8), "[6912:9216, 0:7168]"},
		{"model.layers.0.self_attn.q_proj.weight", []int64{24576, 7168}, tp(3, 8), "[9216:12288, 0:7168]"},
		{"model.layers.0.mlp.experts.1.w2.weight", []int64{4096, 1024}, tp(1, 2), "[0:4096, 512:1024]"},
	})
}

func TestExpertRange(t *testing.T) {
	// 10 experts over 4 ranks: 3, 3, 2, 2.
	got := [][2]int{}
	for e := range 4 {
		lo, hi := ExpertRange(10, e, 4)
		got = append(got, [2]int{lo, hi})
	}
	want := [][2]int{{0, 3}, {3, 6}, {6, 8}, {8, 10}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ExpertRange(10, ·, 4) = %v, want %v", got, want)
		}
	}
}

func TestRulesOverride(t *testing.T) {
	rs, err := DefaultRules().With(Rule{`\.o_proj\.weight$`, Replicated})
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := rs.Kind("model.layers.0.self_attn.o_proj.weight"); k != Replicated {
		t.Errorf("override: got %v", k)
	}
	if k, _ := rs.Kind("model.layers.0.mlp.down_proj.weight"); k != Row {
		t.Errorf("default after override: got %v", k)
	}
	if _, err := DefaultRules().Kind("model.vision_tower.patch.weight"); err == nil || !strings.Contains(err.Error(), "model.vision_tower.patch.weight") {
		t.Errorf("unmatched name: %v", err)
	}
	r, err := ParseRule(`vision\..*=replicated`)
	if err != nil || r.Pattern != `vision\..*` || r.Kind != Replicated {
		t.Errorf("ParseRule: %+v %v", r, err)
	}
	for _, bad := range []string{"nokind", "x=sideways", "=row"} {
		if _, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) accepted", bad)
		}
	}
	if _, err := NewRules(Rule{"(", Row}); err == nil {
		t.Error("bad pattern accepted")
	}
	for k := range kindNames {
		if got, err := ParseKind(k.String()); err != nil || got != k {
			t.Errorf("ParseKind(%v) = %v, %v", k, got, err)
		}
	}
}
