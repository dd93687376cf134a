package sink_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/safetensors/safetensorstest"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
)

// configName is the file the sink writes.
const configName = "config.json"

const testHFConfig = `{
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 256,
  "torch_dtype": "bfloat16"
}
`

// configShards is a small Llama-like checkpoint: linear weights the
// default rule quantizes, an embedding, a norm, a router gate and an LM
// head it leaves as they are.
func configShards() [][]safetensorstest.Spec {
	return [][]safetensorstest.Spec{
		{
			{Name: "model.embed_tokens.weight", DType: dtype.BF16, Shape: []int64{300, 256}},
			{Name: "model.layers.0.self_attn.q_proj.weight", DType: dtype.BF16, Shape: []int64{256, 256}},
			{Name: "model.layers.0.input_layernorm.weight", DType: dtype.BF16, Shape: []int64{256}},
		},
		{
			{Name: "model.layers.0.mlp.up_proj.weight", DType: dtype.F16, Shape: []int64{384, 256}},
			{Name: "model.layers.0.mlp.gate.weight", DType: dtype.F32, Shape: []int64{8, 256}},
			{Name: "lm_head.weight", DType: dtype.BF16, Shape: []int64{300, 256}},
		},
	}
}

// readHFConfig returns the config.json in dir, parsed, and its
// quantization_config's modules_to_not_convert (nil without one).
func readHFConfig(t *testing.T, dir string) (map[string]any, []string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, configName))
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v\n%s", dir, err, b)
	}
	q, ok := c[quant.HFConfigKey].(map[string]any)
	if !ok {
		return c, nil
	}
	var keep []string
	for _, m := range q["modules_to_not_convert"].([]any) {
		keep = append(keep, m.(string))
	}
	return c, keep
}

// TestSafetensorsConfig runs a quantized round of a checkpoint, then
// the same checkpoint unquantized, then quantized again, into three
// sinks: one given the model's config.json (SafetensorsConfig), whose
// output gets it with transformers' FP8 quantization_config, then without
// it (byte for byte the model's), then with it again; one whose directory
// holds a config.json already, which it updates the same way; one with
// neither, which writes no config.json.
func TestSafetensorsConfig(t *testing.T) {
	src := t.TempDir()
	safetensorstest.Write(t, src, 31, configShards(), true)
	cfg := filepath.Join(src, configName)
	if err := os.WriteFile(cfg, []byte(testHFConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	ckpt, err := source.OpenCheckpoint(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	qs, err := stages.Quantize(ckpt, stages.QuantizeConfig{Scheme: quant.FP8Block})
	if err != nil {
		t.Fatal(err)
	}
	outs := safetensorstest.OutDirs(t, 3)
	if err := os.MkdirAll(outs[1], 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outs[1], configName), []byte(testHFConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	sinks := []stages.Sink{
		sink.WriteSafetensors(outs[0], sink.SafetensorsWithoutSync(), sink.SafetensorsConfig(cfg)),
		sink.WriteSafetensors(outs[1], sink.SafetensorsWithoutSync()),
		sink.WriteSafetensors(outs[2], sink.SafetensorsWithoutSync(), sink.SafetensorsConfig("")),
	}
	g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 4, Bucket: 64 << 10, Checksum: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wantKeep := []string{"lm_head", "model.embed_tokens", "model.layers.0.mlp.gate"}
	for round, src := range []stages.Source{qs, ckpt, qs} {
		if err := g.Round(ctx, src, uint64(round+1), sinks); err != nil {
			t.Fatal(err)
		}
		quantized := round != 1
		for i, o := range outs[:2] {
			c, keep := readHFConfig(t, o)
			if c["model_type"] != "llama" || c["hidden_size"] != 256.0 {
				t.Fatalf("round %d, %s: the model's keys are gone: %v", round+1, o, c)
			}
			if quantized != (keep != nil) || (quantized && !slices.Equal(keep, wantKeep)) {
				t.Fatalf("round %d, %s: modules_to_not_convert %v, want %v (quantized %v)", round+1, o, keep, wantKeep, quantized)
			}
			if q, _ := c[quant.HFConfigKey].(map[string]any); quantized && (q["quant_method"] != "fp8" || q["activation_scheme"] != "dynamic") {
				t.Fatalf("round %d, %s: quantization_config %v", round+1, o, q)
			}
			if !slices.Contains(sinks[i].(*sink.Safetensors).Files(), filepath.Join(o, configName)) && (i == 0 || quantized) {
				t.Fatalf("round %d: Files() = %q, without %s", round+1, sinks[i].(*sink.Safetensors).Files(), configName)
			}
		}
		if !quantized {
			if b, _ := os.ReadFile(filepath.Join(outs[0], configName)); string(b) != testHFConfig {
				t.Fatalf("round %d: an unquantized round's config.json is not the model's:\n%s", round+1, b)
			}
		}
		if _, err := os.Stat(filepath.Join(outs[2], configName)); !os.IsNotExist(err) {
			t.Fatalf("round %d: a sink without a configuration wrote %s (%v)", round+1, configName, err)
		}
		for _, o := range outs {
			safetensorstest.DirFiles(t, o) // no round directory left behind
		}
	}
}

// TestSafetensorsConfigErrors checks that a configuration the sink
// cannot use fails the round with an error naming it, leaving nothing of
// the round behind: a file that is not JSON, one that does not exist.
func TestSafetensorsConfigErrors(t *testing.T) {
	src := t.TempDir()
	safetensorstest.Write(t, src, 32, configShards(), true)
	ckpt, err := source.OpenCheckpoint(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ckpt.Close()
	bad := filepath.Join(t.TempDir(), configName)
	if err := os.WriteFile(bad, []byte("not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{bad, "not a JSON object"},
		{filepath.Join(t.TempDir(), "missing.json"), "missing.json"},
	} {
		out := t.TempDir()
		g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 2, Bucket: 64 << 10})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := g.Round(ctx, ckpt, 1, []stages.Sink{sink.WriteSafetensors(out, sink.SafetensorsWithoutSync(), sink.SafetensorsConfig(c.path))})
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v, want an error saying %q", c.path, err, c.want)
		}
		if files := safetensorstest.DirFiles(t, out); len(files) != 0 {
			t.Fatalf("%s: the failed round left %q", c.path, files)
		}
	}
}
