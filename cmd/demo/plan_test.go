package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tinyConfig is a small DeepSeek-style MoE with MLA: 4 layers, 8 experts.
const tinyConfig = `{"model_type":"deepseek_v3","hidden_size":256,"intermediate_size":512,
"moe_intermediate_size":64,"num_hidden_layers":4,"num_attention_heads":8,"num_key_value_heads":8,
"vocab_size":1000,"n_routed_experts":8,"n_shared_experts":1,"first_k_dense_replace":1,
"topk_method":"noaux_tc","q_lora_rank":64,"kv_lora_rank":32,"qk_nope_head_dim":16,
"qk_rope_head_dim":8,"v_head_dim":16}`

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func runPlanArgs(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(t.Context(), append([]string{"plan"}, args...), &out, &errb, func(string) string { return "" })
	return code, out.String(), errb.String()
}

func TestPlanJSON(t *testing.T) {
	cfg := writeConfig(t, tinyConfig)
	code, out, stderr := runPlanArgs(t, "--config", cfg, "--trainer-ranks", "16", "--trainer-fsdp", "16",
		"--replicas", "2", "--tp", "4", "--nic", "400Gb/s", "--nvlink", "450GB/s", "--gpus-per-node", "8", "--latency", "0", "--json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, k := range []string{"predicted_seconds", "bound_seconds", "bytes_per_link_max", "digest", "sender_balance", "receiver_balance", "bytes_per_sender_max", "bytes_per_receiver_mean", "single_sender_broadcast_seconds"} {
		if _, ok := r[k]; !ok {
			t.Errorf("--json has no %s", k)
		}
	}
	if r["senders"].(float64) != 16 || r["receivers"].(float64) != 8 {
		t.Errorf("senders %v, receivers %v", r["senders"], r["receivers"])
	}
	if r["nic_bytes_per_second"].(float64) != 50e9 {
		t.Errorf("400Gb/s read as %v B/s", r["nic_bytes_per_second"])
	}
	pred, bound := r["predicted_seconds"].(float64), r["bound_seconds"].(float64)
	if !(bound > 0) || pred < bound || pred > 1.1*bound {
		t.Errorf("predicted %g, bound %g", pred, bound)
	}
	// The same inputs, the same digest.
	_, out2, _ := runPlanArgs(t, "--config", cfg, "--trainer-ranks", "16", "--replicas", "2", "--tp", "4", "--latency", "0s", "--json")
	var r2 map[string]any
	json.Unmarshal([]byte(out2), &r2)
	if r2["digest"] != r["digest"] {
		t.Errorf("digests differ: %v, %v", r["digest"], r2["digest"])
	}
	// An EP layout plans too, and a receiver takes fewer bytes at EP 8 than at TP 4 alone.
	_, out3, stderr := runPlanArgs(t, "--config", cfg, "--trainer-ranks", "16", "--replicas", "1", "--tp", "4", "--ep", "8", "--json")
	var r3 map[string]any
	if err := json.Unmarshal([]byte(out3), &r3); err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	if r3["receivers"].(float64) != 8 || r3["bytes_per_receiver_max"].(float64) >= r["bytes_per_receiver_max"].(float64) {
		t.Errorf("EP 8: %v receivers, %v bytes each (TP 4: %v)", r3["receivers"], r3["bytes_per_receiver_max"], r["bytes_per_receiver_max"])
	}
}

func TestPlanTable(t *testing.T) {
	cfg := writeConfig(t, tinyConfig)
	code, out, stderr := runPlanArgs(t, "--config", cfg, "--trainer-ranks", "8", "--trainer-tp", "2", "--replicas", "2", "--tp", "2", "--nic", "50GB/s")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"deepseek_v3", "trainer:  8 GPUs: FSDP 4 × TP 2", "rollout:  2 replicas × 2 GPUs (TP 2, EP 1) = 4 GPUs",
		"NIC 50 GB/s (400Gb/s)", "predicted", "bound", "predicted / bound", "single-sender broadcast", "digest "} {
		if !strings.Contains(out, want) {
			t.Errorf("the table has no %q:\n%s", want, out)
		}
	}
}

func TestPlanTestdataConfigs(t *testing.T) {
	if testing.Short() {
		t.Skip("plans a 671B model")
	}
	code, out, stderr := runPlanArgs(t, "--config", "../../layout/testdata/deepseek-v3.config.json", "--replicas", "2", "--tp", "8", "--trainer-ranks", "64", "--json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var r struct {
		Parameters int64 `json:"parameters"`
	}
	json.Unmarshal([]byte(out), &r)
	if r.Parameters < 670e9 || r.Parameters > 672e9 {
		t.Errorf("DeepSeek-V3: %d parameters", r.Parameters)
	}
}

func TestPlanErrors(t *testing.T) {
	cfg := writeConfig(t, tinyConfig)
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--config is required"},
		{[]string{"--config", filepath.Join(t.TempDir(), "none.json")}, "none.json"},
		{[]string{"--config", writeConfig(t, `{"hidden_size":"big"}`)}, `hidden_size is "big"`},
		{[]string{"--config", cfg, "--nic", "400"}, "--nic 400"},
		{[]string{"--config", cfg, "--nic", "400Gx/s"}, "b/s (bits) or B/s"},
		{[]string{"--config", cfg, "--nvlink", "-1GB/s"}, "--nvlink"},
		{[]string{"--config", cfg, "--tp", "3"}, "does not split over 3 TP ranks"},
		{[]string{"--config", cfg, "--trainer-ranks", "16", "--trainer-fsdp", "4"}, "--trainer-fsdp 4"},
		{[]string{"--config", cfg, "--replicas", "0"}, "--replicas 0"},
		{[]string{"--config", cfg, "--dtype", "int3"}, "--dtype int3"},
		{[]string{"--config", cfg, "--rule", "oops"}, "--rule"},
		{[]string{"--config", cfg, "--colocated"}, "--colocated"},
		{[]string{"--config", cfg, "--frobnicate"}, "frobnicate"},
		{[]string{"--config", cfg, "extra"}, `unexpected argument "extra"`},
	} {
		code, _, stderr := runPlanArgs(t, c.args...)
		if code != exitUsage || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, %q; want exit %d and %q", c.args, code, stderr, exitUsage, c.want)
		}
	}
	// --json errors are one JSON object.
	code, out, _ := runPlanArgs(t, "--config", cfg, "--tp", "3", "--json")
	var r struct {
		Error      string `json:"error"`
		ExitStatus int    `json:"exit_status"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != exitUsage || r.ExitStatus != exitUsage || r.Error == "" {
		t.Errorf("--json error: %d %q %v", code, out, err)
	}
	// A user rule overrides the defaults: o_proj replicated costs more bytes.
	_, base, _ := runPlanArgs(t, "--config", cfg, "--trainer-ranks", "4", "--replicas", "1", "--tp", "4", "--json")
	_, over, _ := runPlanArgs(t, "--config", cfg, "--trainer-ranks", "4", "--replicas", "1", "--tp", "4", "--rule", `o_proj\.weight$=replicated`, "--json")
	var a, b struct {
		Bytes int64 `json:"bytes"`
	}
	json.Unmarshal([]byte(base), &a)
	json.Unmarshal([]byte(over), &b)
	if b.Bytes <= a.Bytes {
		t.Errorf("--rule o_proj=replicated: %d bytes, default %d", b.Bytes, a.Bytes)
	}
	code, out, _ = runPlanArgs(t, "--help")
	if code != exitOK || !strings.Contains(out, "--trainer-fsdp") || !strings.Contains(out, "demo plan --config") {
		t.Errorf("--help: %d\n%s", code, out)
	}
}

func TestPlanParseRate(t *testing.T) {
	for in, want := range map[string]float64{"400Gb/s": 50e9, "450GB/s": 450e9, "1GiB/s": 1 << 30, "800 Gbps": 100e9, "100MB/s": 100e6, "8b/s": 1} {
		if got, err := parseRate("nic", in); err != nil || got != want {
			t.Errorf("parseRate(%q) = %g, %v; want %g", in, got, err, want)
		}
	}
}
