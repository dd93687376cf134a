package layout

import (
	"os"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

func loadConfig(t testing.TB, name string) *HFConfig {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseHFConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func params(ts []Tensor) int64 {
	var n int64
	for _, t := range ts {
		n += t.Elements()
	}
	return n
}

// TestHFConfigParameterCounts: the generated tensors add up to the
// published sizes: DeepSeek-V3 671B (without its 14B multi-token-prediction
// layer), Kimi-K2 about 1.03T.
func TestHFConfigParameterCounts(t *testing.T) {
	for _, c := range []struct {
		file   string
		lo, hi float64 // billions
	}{
		{"deepseek-v3.config.json", 670, 672},
		{"kimi-k2.config.json", 1025, 1035},
	} {
		cfg := loadConfig(t, c.file)
		ts := cfg.Tensors(dtype.BF16)
		b := float64(params(ts)) / 1e9
		t.Logf("%s: %d tensors, %.2fB parameters", c.file, len(ts), b)
		if b < c.lo || b > c.hi {
			t.Errorf("%s: %.2fB parameters, want %g..%g", c.file, b, c.lo, c.hi)
		}
		// Every name has a rule, and the model splits at TP 8 and EP 8.
		if _, err := NewParallel(ts, nil, cfg.Model(), Spec{Ranks: 8, TP: 8, EP: 8}); err != nil {
			t.Errorf("%s: %v", c.file, err)
		}
	}
}

func TestHFConfigDense(t *testing.T) {
	// Qwen3-8B-like: 36 layers, hidden 4096, 32 heads, 8 kv heads, head_dim 128, tied no.
	c, err := ParseHFConfig([]byte(`{"model_type":"qwen3","hidden_size":4096,"intermediate_size":12288,
		"num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,
		"vocab_size":151936,"tie_word_embeddings":false}`))
	if err != nil {
		t.Fatal(err)
	}
	ts := c.Tensors(dtype.BF16)
	if b := float64(params(ts)) / 1e9; b < 8.1 || b > 8.3 {
		t.Errorf("Qwen3-8B: %.2fB parameters", b)
	}
	names := map[string]bool{}
	for _, x := range ts {
		names[x.Name] = true
	}
	for _, n := range []string{"model.layers.0.self_attn.q_norm.weight", "lm_head.weight", "model.layers.35.mlp.down_proj.weight"} {
		if !names[n] {
			t.Errorf("no %s", n)
		}
	}
	if _, err := NewParallel(ts, nil, c.Model(), Spec{Ranks: 8, TP: 8}); err != nil {
		t.Error(err)
	}
	// Llama tied embeddings: no lm_head; Qwen2: q/k/v biases.
	c, _ = ParseHFConfig([]byte(`{"model_type":"qwen2","hidden_size":896,"intermediate_size":4864,"num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,"tie_word_embeddings":true}`))
	names = map[string]bool{}
	for _, x := range c.Tensors(dtype.BF16) {
		names[x.Name] = true
	}
	if names["lm_head.weight"] || !names["model.layers.3.self_attn.k_proj.bias"] {
		t.Errorf("tied Qwen2: lm_head %v, k bias %v", names["lm_head.weight"], names["model.layers.3.self_attn.k_proj.bias"])
	}
}

func TestHFConfigErrorsNameTheField(t *testing.T) {
	base := `"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"intermediate_size":128`
	for _, c := range []struct{ json, want string }{
		{`{"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100}`, "hidden_size is missing"},
		{`{` + base + `,"num_key_value_heads":"eight"}`, `num_key_value_heads is "eight"`},
		{`{` + base + `,"tie_word_embeddings":1}`, "tie_word_embeddings is 1"},
		{`{"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100}`, "intermediate_size is missing"},
		{`{` + base + `,"n_routed_experts":8}`, "moe_intermediate_size is missing"},
		{`{` + base + `,"kv_lora_rank":512}`, "qk_nope_head_dim"},
		{`{` + base + `,"hidden_size":2.5}`, "hidden_size is 2.5"},
		{`{"hidden_size":0,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":100,"intermediate_size":1}`, "hidden_size must be positive"},
		{`[1]`, "config.json"},
	} {
		_, err := ParseHFConfig([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", c.json, err, c.want)
		}
	}
}
