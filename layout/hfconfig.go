package layout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/weightcast/weightcast/dtype"
)

// HFConfig holds the fields of a Hugging Face config.json that fix a
// decoder-only model's tensors: Llama, Qwen2/3 (dense and MoE) and
// DeepSeek-V2/V3 or Kimi-K2 (MLA and MoE) style.
type HFConfig struct {
	ModelType         string
	Hidden            int // hidden_size
	Intermediate      int // intermediate_size (dense layers)
	Layers            int // num_hidden_layers
	Heads             int // num_attention_heads
	KVHeads           int // num_key_value_heads, default Heads
	HeadDim           int // head_dim, default Hidden / Heads
	Vocab             int // vocab_size
	TieEmbeddings     bool
	AttentionBias     bool // q/k/v biases (attention_bias, or Qwen2's model_type)
	Experts           int  // n_routed_experts or num_experts
	MoEIntermediate   int  // moe_intermediate_size
	SharedExperts     int  // n_shared_experts (DeepSeek)
	SharedExpertInter int  // shared_expert_intermediate_size (Qwen2-MoE)
	FirstDense        int  // first_k_dense_replace
	MoEFreq           int  // moe_layer_freq or decoder_sparse_step, default 1
	ScoreBias         bool // topk_method "noaux_tc": a router e_score_correction_bias
	QLoRARank         int  // q_lora_rank, 0 for none (null)
	KVLoRARank        int  // kv_lora_rank: MLA when positive
	QKNope            int  // qk_nope_head_dim
	QKRope            int  // qk_rope_head_dim
	VHead             int  // v_head_dim
}

// ParseHFConfig reads a config.json. An error names the field.
func ParseHFConfig(data []byte) (*HFConfig, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	c := &HFConfig{}
	var err error
	num := func(dst *int, required bool, names ...string) {
		if err != nil {
			return
		}
		for _, n := range names {
			v, ok := raw[n]
			if !ok || bytes.Equal(v, []byte("null")) {
				continue
			}
			var x float64
			if e := json.Unmarshal(v, &x); e != nil || x != float64(int(x)) || x < 0 {
				err = fmt.Errorf("config.json: %s is %s, want a non-negative integer", n, v)
				return
			}
			*dst = int(x)
			return
		}
		if required {
			err = fmt.Errorf("config.json: %s is missing", names[0])
		}
	}
	flag := func(dst *bool, name string) {
		if v, ok := raw[name]; ok && err == nil && !bytes.Equal(v, []byte("null")) {
			if e := json.Unmarshal(v, dst); e != nil {
				err = fmt.Errorf("config.json: %s is %s, want true or false", name, v)
			}
		}
	}
	str := func(dst *string, name string) {
		if v, ok := raw[name]; ok && err == nil && !bytes.Equal(v, []byte("null")) {
			if e := json.Unmarshal(v, dst); e != nil {
				err = fmt.Errorf("config.json: %s is %s, want a string", name, v)
			}
		}
	}
	str(&c.ModelType, "model_type")
	num(&c.Hidden, true, "hidden_size")
	num(&c.Layers, true, "num_hidden_layers")
	num(&c.Heads, true, "num_attention_heads")
	num(&c.Vocab, true, "vocab_size")
	num(&c.Intermediate, false, "intermediate_size")
	num(&c.KVHeads, false, "num_key_value_heads")
	num(&c.HeadDim, false, "head_dim")
	flag(&c.TieEmbeddings, "tie_word_embeddings")
	flag(&c.AttentionBias, "attention_bias")
	num(&c.Experts, false, "n_routed_experts", "num_experts")
	num(&c.MoEIntermediate, false, "moe_intermediate_size")
	num(&c.SharedExperts, false, "n_shared_experts")
	num(&c.SharedExpertInter, false, "shared_expert_intermediate_size")
	num(&c.FirstDense, false, "first_k_dense_replace")
	num(&c.MoEFreq, false, "moe_layer_freq", "decoder_sparse_step")
	num(&c.QLoRARank, false, "q_lora_rank")
	num(&c.KVLoRARank, false, "kv_lora_rank")
	num(&c.QKNope, false, "qk_nope_head_dim")
	num(&c.QKRope, false, "qk_rope_head_dim")
	num(&c.VHead, false, "v_head_dim")
	var topk string
	str(&topk, "topk_method")
	if err != nil {
		return nil, err
	}
	c.ScoreBias = topk == "noaux_tc"
	if c.ModelType == "qwen2" || c.ModelType == "qwen2_moe" {
		c.AttentionBias = true
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden_size", c.Hidden}, {"num_hidden_layers", c.Layers}, {"num_attention_heads", c.Heads}, {"vocab_size", c.Vocab}} {
		if f.v == 0 {
			return nil, fmt.Errorf("config.json: %s must be positive", f.name)
		}
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 {
		if c.Hidden%c.Heads != 0 {
			return nil, fmt.Errorf("config.json: hidden_size %d is not a multiple of num_attention_heads %d; give head_dim", c.Hidden, c.Heads)
		}
		c.HeadDim = c.Hidden / c.Heads
	}
	if c.MoEFreq == 0 {
		c.MoEFreq = 1
	}
	if c.Experts > 0 && c.MoEIntermediate == 0 {
		return nil, fmt.Errorf("config.json: moe_intermediate_size is missing for %d experts", c.Experts)
	}
	if c.KVLoRARank > 0 && (c.QKNope == 0 || c.QKRope == 0 || c.VHead == 0) {
		return nil, fmt.Errorf("config.json: kv_lora_rank %d (MLA) needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim", c.KVLoRARank)
	}
	for l := range c.Layers {
		if !c.moeLayer(l) && c.Intermediate == 0 {
			return nil, fmt.Errorf("config.json: intermediate_size is missing (layer %d is dense)", l)
		}
	}
	return c, nil
}

func (c *HFConfig) moeLayer(l int) bool {
	return c.Experts > 0 && l >= c.FirstDense && l%c.MoEFreq == 0
}

// Model returns the head and expert counts the rules need.
func (c *HFConfig) Model() Model {
	kv := c.KVHeads
	if c.KVLoRARank > 0 {
		kv = c.Heads // MLA has no separate kv heads; the rules do not use it
	}
	return Model{Heads: c.Heads, KVHeads: kv, Experts: c.Experts}
}

// Tensors returns the model's tensors with Hugging Face names and shapes
// ([out, in] for linear weights), of dtype dt, sorted by name. DeepSeek's
// multi-token-prediction layers (num_nextn_predict_layers) are left out, as
// vLLM's main model leaves them.
func (c *HFConfig) Tensors(dt dtype.DType) []Tensor {
	var ts []Tensor
	add := func(name string, shape ...int) {
		s := make([]int64, len(shape))
		for i, d := range shape {
			s[i] = int64(d)
		}
		ts = append(ts, Tensor{Name: name, DType: dt, Shape: s})
	}
	h := c.Hidden
	add("model.embed_tokens.weight", c.Vocab, h)
	add("model.norm.weight", h)
	if !c.TieEmbeddings {
		add("lm_head.weight", c.Vocab, h)
	}
	for l := range c.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", h)
		add(p+"post_attention_layernorm.weight", h)
		a := p + "self_attn."
		if c.KVLoRARank > 0 {
			qk := c.QKNope + c.QKRope
			if c.QLoRARank > 0 {
				add(a+"q_a_proj.weight", c.QLoRARank, h)
				add(a+"q_a_layernorm.weight", c.QLoRARank)
				add(a+"q_b_proj.weight", c.Heads*qk, c.QLoRARank)
			} else {
				add(a+"q_proj.weight", c.Heads*qk, h)
			}
			add(a+"kv_a_proj_with_mqa.weight", c.KVLoRARank+c.QKRope, h)
			add(a+"kv_a_layernorm.weight", c.KVLoRARank)
			add(a+"kv_b_proj.weight", c.Heads*(c.QKNope+c.VHead), c.KVLoRARank)
			add(a+"o_proj.weight", h, c.Heads*c.VHead)
		} else {
			q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
			add(a+"q_proj.weight", q, h)
			add(a+"k_proj.weight", kv, h)
			add(a+"v_proj.weight", kv, h)
			if c.AttentionBias {
				add(a+"q_proj.bias", q)
				add(a+"k_proj.bias", kv)
				add(a+"v_proj.bias", kv)
			}
			if c.ModelType == "qwen3" || c.ModelType == "qwen3_moe" {
				add(a+"q_norm.weight", c.HeadDim)
				add(a+"k_norm.weight", c.HeadDim)
			}
			add(a+"o_proj.weight", h, q)
		}
		m := p + "mlp."
		if !c.moeLayer(l) {
			add(m+"gate_proj.weight", c.Intermediate, h)
			add(m+"up_proj.weight", c.Intermediate, h)
			add(m+"down_proj.weight", h, c.Intermediate)
			continue
		}
		add(m+"gate.weight", c.Experts, h)
		if c.ScoreBias {
			add(m+"gate.e_score_correction_bias", c.Experts)
		}
		mi := c.MoEIntermediate
		for e := range c.Experts {
			x := fmt.Sprintf("%sexperts.%d.", m, e)
			add(x+"gate_proj.weight", mi, h)
			add(x+"up_proj.weight", mi, h)
			add(x+"down_proj.weight", h, mi)
		}
		switch {
		case c.SharedExperts > 0:
			si := mi * c.SharedExperts
			add(m+"shared_experts.gate_proj.weight", si, h)
			add(m+"shared_experts.up_proj.weight", si, h)
			add(m+"shared_experts.down_proj.weight", h, si)
		case c.SharedExpertInter > 0:
			si := c.SharedExpertInter
			add(m+"shared_expert.gate_proj.weight", si, h)
			add(m+"shared_expert.up_proj.weight", si, h)
			add(m+"shared_expert.down_proj.weight", h, si)
			add(m+"shared_expert_gate.weight", 1, h)
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts
}
