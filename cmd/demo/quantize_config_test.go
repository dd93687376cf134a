package main

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/safetensors"
)

// TestQuantizeCheckpointConfig runs a local launch of a checkpoint
// directory with a config.json under --quantize fp8-block --out: each
// receiver's directory gets the config.json, its keys as they were, with
// transformers' FP8 quantization_config naming the modules left in BF16
// (the embedding and the LM head; the norms are not linear). Without
// --quantize it gets the config.json as it was.
func TestQuantizeCheckpointConfig(t *testing.T) {
	model := t.TempDir()
	var layout safetensors.ModelLayout
	sh := safetensors.ShardLayout{Name: "model.safetensors"}
	for _, ti := range []safetensors.TensorInfo{
		{Name: "model.embed_tokens.weight", DType: dtype.BF16, Shape: []int64{256, 128}},
		{Name: "model.layers.0.input_layernorm.weight", DType: dtype.BF16, Shape: []int64{128}},
		{Name: "model.layers.0.self_attn.q_proj.weight", DType: dtype.BF16, Shape: []int64{128, 128}},
		{Name: "model.layers.0.mlp.down_proj.weight", DType: dtype.BF16, Shape: []int64{128, 256}},
		{Name: "model.norm.weight", DType: dtype.BF16, Shape: []int64{128}},
		{Name: "lm_head.weight", DType: dtype.BF16, Shape: []int64{256, 128}},
	} {
		sh.Tensors = append(sh.Tensors, ti)
	}
	layout.Shards = []safetensors.ShardLayout{sh}
	w, err := safetensors.CreateModel(model, layout, safetensors.WithoutSync())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(8, 9))
	for _, ti := range sh.Tensors {
		n, _ := ti.DType.Bytes(ti.Shape)
		b := make([]byte, n)
		for i := 0; i < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], uint16(math.Float32bits(float32(rng.NormFloat64()*0.02))>>16))
		}
		if err := w.WriteTensorAt(ti.Name, b, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	const cfg = "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 128,\n  \"tie_word_embeddings\": false\n}\n"
	if err := os.WriteFile(filepath.Join(model, "config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, quantize := range []string{"fp8-block", "none"} {
		out := t.TempDir()
		cmd := exec.Command(demoBin, "--ranks", "3", "--rounds", "1", "--bucket", "64KiB", "--model", model, "--quantize", quantize, "--out", out)
		cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES=")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		for _, r := range []string{"rank1", "rank2"} {
			b, err := os.ReadFile(filepath.Join(out, r, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if quantize == "none" {
				if string(b) != cfg {
					t.Fatalf("%s without --quantize: config.json %s, want the model's", r, b)
				}
				continue
			}
			var c struct {
				ModelType string `json:"model_type"`
				Hidden    int    `json:"hidden_size"`
				Q         struct {
					Method string   `json:"quant_method"`
					Scheme string   `json:"activation_scheme"`
					Block  []int    `json:"weight_block_size"`
					Keep   []string `json:"modules_to_not_convert"`
				} `json:"quantization_config"`
			}
			if err := json.Unmarshal(b, &c); err != nil {
				t.Fatalf("%s: %v\n%s", r, err, b)
			}
			if c.ModelType != "llama" || c.Hidden != 128 || c.Q.Method != "fp8" || c.Q.Scheme != "dynamic" || !slices.Equal(c.Q.Block, []int{128, 128}) ||
				!slices.Equal(c.Q.Keep, []string{"lm_head", "model.embed_tokens"}) {
				t.Fatalf("%s: config.json %s", r, b)
			}
			m, err := safetensors.OpenModel(filepath.Join(out, r))
			if err != nil {
				t.Fatal(err)
			}
			ti, ok := m.Tensor("model.layers.0.self_attn.q_proj.weight")
			_, scaled := m.Tensor("model.layers.0.self_attn.q_proj.weight" + quant.ScaleSuffix)
			m.Close()
			if !ok || ti.DType != dtype.F8E4M3 || !scaled {
				t.Fatalf("%s: q_proj is %v (found %v), scales %v", r, ti.DType, ok, scaled)
			}
		}
	}
}
