package quant

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

// llamaTensors lists a two-layer Llama's tensors as a quantized round
// carries them: the linear weights as FP8 codes and scales, the rest as
// they were; with lmHead false, the LM head is tied (absent).
func llamaTensors(lmHead bool) []TensorMeta {
	ts := []TensorMeta{{"model.embed_tokens.weight", dtype.BF16, []int64{1000, 256}}}
	for _, l := range []string{"0", "1"} {
		p := "model.layers." + l + "."
		ts = append(ts, TensorMeta{p + "input_layernorm.weight", dtype.BF16, []int64{256}})
		for _, w := range []struct {
			name       string
			rows, cols int64
		}{{"self_attn.q_proj", 256, 256}, {"self_attn.k_proj", 128, 256}, {"self_attn.v_proj", 128, 256}, {"self_attn.o_proj", 256, 256},
			{"mlp.gate_proj", 640, 256}, {"mlp.up_proj", 640, 256}, {"mlp.down_proj", 256, 640}} {
			r, c := ScaleShape(w.rows, w.cols)
			ts = append(ts, TensorMeta{p + w.name + ".weight", dtype.F8E4M3, []int64{w.rows, w.cols}},
				TensorMeta{p + w.name + ".weight" + ScaleSuffix, dtype.F32, []int64{r, c}})
		}
		ts = append(ts, TensorMeta{p + "self_attn.q_proj.bias", dtype.BF16, []int64{256}})
	}
	ts = append(ts, TensorMeta{"model.norm.weight", dtype.BF16, []int64{256}})
	if lmHead {
		ts = append(ts, TensorMeta{"lm_head.weight", dtype.BF16, []int64{1000, 256}})
	}
	return ts
}

const llamaConfig = `{
  "architectures": ["LlamaForCausalLM"],
  "hidden_size": 256,
  "torch_dtype": "bfloat16",
  "vocab_size": 1000
}
`

// quantConfig returns the quantization_config of a config.json, and the
// config's keys in order.
func quantConfig(t *testing.T, b []byte) (map[string]any, []string) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	keys, _, err := jsonObject(b)
	if err != nil {
		t.Fatal(err)
	}
	q, _ := m[HFConfigKey].(map[string]any)
	return q, keys
}

// TestQuantHFConfig checks the quantization_config written for a
// quantized Llama (tied LM head or not), an MoE whose router stays BF16,
// an LM head quantized on request, and that the config's other keys keep
// their order and values, and a second update changes nothing.
func TestQuantHFConfig(t *testing.T) {
	moe := llamaTensors(true)
	moe = append(moe, TensorMeta{"model.layers.1.mlp.gate.weight", dtype.BF16, []int64{8, 256}},
		TensorMeta{"model.layers.1.mlp.experts.0.up_proj.weight", dtype.F8E4M3, []int64{256, 256}},
		TensorMeta{"model.layers.1.mlp.experts.0.up_proj.weight" + ScaleSuffix, dtype.F32, []int64{2, 2}})
	head := llamaTensors(false)
	head = append(head, TensorMeta{"lm_head.weight", dtype.F8E4M3, []int64{1000, 256}}, TensorMeta{"lm_head.weight" + ScaleSuffix, dtype.F32, []int64{8, 2}})
	for name, c := range map[string]struct {
		ts   []TensorMeta
		keep []string
	}{
		"llama":          {llamaTensors(true), []string{"lm_head", "model.embed_tokens"}},
		"tied head":      {llamaTensors(false), []string{"lm_head", "model.embed_tokens"}},
		"moe":            {moe, []string{"lm_head", "model.embed_tokens", "model.layers.1.mlp.gate"}},
		"quantized head": {head, []string{"model.embed_tokens"}},
	} {
		out, changed, err := UpdateHFConfig([]byte(llamaConfig), c.ts)
		if err != nil || !changed {
			t.Fatalf("%s: changed %v, %v", name, changed, err)
		}
		q, keys := quantConfig(t, out)
		if !slices.Equal(keys, []string{"architectures", "hidden_size", "torch_dtype", "vocab_size", HFConfigKey}) {
			t.Errorf("%s: keys %v", name, keys)
		}
		var keep []string
		for _, m := range q["modules_to_not_convert"].([]any) {
			keep = append(keep, m.(string))
		}
		bs, _ := q["weight_block_size"].([]any)
		if q["quant_method"] != "fp8" || q["activation_scheme"] != "dynamic" || len(bs) != 2 || bs[0] != 128.0 || bs[1] != 128.0 || !slices.Equal(keep, c.keep) {
			t.Errorf("%s: quantization_config %v, want modules_to_not_convert %v", name, q, c.keep)
		}
		if !strings.Contains(string(out), "\n  \"hidden_size\": 256,\n") || !strings.HasSuffix(string(out), "}\n") {
			t.Errorf("%s: not written as transformers writes a config:\n%s", name, out)
		}
		again, changed, err := UpdateHFConfig(out, c.ts)
		if err != nil || changed || string(again) != string(out) {
			t.Errorf("%s: a second update changed %v (%v)", name, changed, err)
		}
	}
}

// TestQuantHFConfigKeeps checks what UpdateHFConfig leaves or removes: a
// round without FP8 weights drops an "fp8" quantization_config and keeps
// another; an FP8 config's other keys and activation scheme stay; FP8
// tensors of another layout (no block scales, or scales of the wrong
// shape) leave the config as it is; a config that is not a JSON object is
// an error.
func TestQuantHFConfigKeeps(t *testing.T) {
	plain := []TensorMeta{{"model.layers.0.mlp.up_proj.weight", dtype.BF16, []int64{256, 256}}}
	stale := `{"a": 1, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}, "b": 2}`
	out, changed, err := UpdateHFConfig([]byte(stale), plain)
	if _, keys := quantConfig(t, out); err != nil || !changed || !slices.Equal(keys, []string{"a", "b"}) {
		t.Errorf("a stale fp8 config: %s, changed %v, %v", out, changed, err)
	}
	gptq := `{"a": 1, "quantization_config": {"quant_method": "gptq", "bits": 4}}`
	if out, changed, err := UpdateHFConfig([]byte(gptq), plain); err != nil || changed || string(out) != gptq {
		t.Errorf("a gptq config: %s, changed %v, %v", out, changed, err)
	}
	deepseek := `{"quantization_config": {"activation_scheme": "static", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [64, 64]}}`
	out, _, err = UpdateHFConfig([]byte(deepseek), llamaTensors(true))
	q, _ := quantConfig(t, out)
	qk, _, _ := jsonObject(mustMarshal(t, q))
	if err != nil || q["fmt"] != "e4m3" || q["activation_scheme"] != "static" || q["weight_block_size"].([]any)[0] != 128.0 || len(qk) != 5 {
		t.Errorf("DeepSeek's fp8 config: %s (%v)", out, err)
	}
	foreign := append(llamaTensors(true), TensorMeta{"x.weight", dtype.F8E4M3, []int64{256, 256}}, TensorMeta{"x.weight_scale", dtype.F32, nil})
	if out, changed, err := UpdateHFConfig([]byte(llamaConfig), foreign); err != nil || changed || string(out) != llamaConfig {
		t.Errorf("an FP8 tensor without block scales: %s, changed %v, %v", out, changed, err)
	}
	wrong := []TensorMeta{{"x.weight", dtype.F8E4M3, []int64{256, 256}}, {"x.weight" + ScaleSuffix, dtype.F32, []int64{1, 2}}}
	if weights, _, f := FP8Weights(wrong); len(weights) != 0 || f != "x.weight" {
		t.Errorf("scales of the wrong shape: weights %v, foreign %q", weights, f)
	}
	for _, bad := range []string{`[1]`, `{"a": }`, `{"a": 1} {}`, ``} {
		if _, _, err := UpdateHFConfig([]byte(bad), plain); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
