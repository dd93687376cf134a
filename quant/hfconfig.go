package quant

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/weightcast/weightcast/dtype"
)

// TensorMeta is what UpdateHFConfig needs of a checkpoint's tensor: its
// name, dtype and shape.
type TensorMeta struct {
	Name  string
	DType dtype.DType
	Shape []int64
}

// HFConfigKey is the key of config.json under which transformers reads a
// model's quantization ("quantization_config").
const HFConfigKey = "quantization_config"

// FP8Weights sorts a checkpoint's tensors for transformers' fine-grained
// FP8 loader (quant_method "fp8"): weights are the block-scaled FP8
// weights, each a 2-D F8_E4M3 tensor W with W_scale_inv beside it, F32 of
// ScaleShape; keep the modules whose weights stay as they are and which
// the loader must leave unconverted (its modules_to_not_convert): the
// module (the name without its last dot-separated part) of every floating
// tensor of two or more dimensions that is neither such a weight nor a
// scale, save modules that own one of the weights, with lm_head always
// among them unless lm_head.weight is quantized (transformers leaves a
// tied lm_head out only where told), sorted. foreign is the first FP8
// tensor that is not such a weight (an FP8 checkpoint of another layout
// sent as it is), or "".
func FP8Weights(ts []TensorMeta) (weights []string, keep []string, foreign string) {
	byName := make(map[string]TensorMeta, len(ts))
	for _, t := range ts {
		byName[t.Name] = t
	}
	isWeight := func(t TensorMeta) bool {
		s, ok := byName[t.Name+ScaleSuffix]
		if t.DType != dtype.F8E4M3 || len(t.Shape) != 2 || !ok || s.DType != dtype.F32 || len(s.Shape) != 2 {
			return false
		}
		r, c := ScaleShape(t.Shape[0], t.Shape[1])
		return s.Shape[0] == r && s.Shape[1] == c
	}
	quantized, owners := map[string]bool{}, map[string]bool{}
	for _, t := range ts {
		if isWeight(t) {
			weights = append(weights, t.Name)
			quantized[t.Name], quantized[t.Name+ScaleSuffix] = true, true
			owners[module(t.Name)] = true
		}
	}
	kept := map[string]bool{}
	for _, t := range ts {
		switch {
		case quantized[t.Name]:
		case t.DType == dtype.F8E4M3 || t.DType == dtype.F8E5M2:
			if foreign == "" {
				foreign = t.Name
			}
		case len(t.Shape) >= 2 && (Sources(t.DType) || t.DType == dtype.F64) && !owners[module(t.Name)]:
			kept[module(t.Name)] = true
		}
	}
	if !owners["lm_head"] {
		kept["lm_head"] = true
	}
	keep = []string{}
	for m := range kept {
		keep = append(keep, m)
	}
	slices.Sort(keep)
	return weights, keep, foreign
}

// module returns the module a parameter belongs to: its name without the
// last dot-separated part ("model.layers.0.mlp.gate.weight" is
// "model.layers.0.mlp.gate"), or the name itself.
func module(name string) string {
	if i := strings.LastIndexByte(name, '.'); i > 0 {
		return name[:i]
	}
	return name
}

// UpdateHFConfig returns config, a Hugging Face config.json, with its
// quantization_config made to describe a checkpoint of the tensors ts,
// and whether that changed it:
//
//   - where ts hold block-scaled FP8 weights (FP8Weights), the config of
//     transformers' FineGrainedFP8Config: {"quant_method": "fp8",
//     "activation_scheme": "dynamic", "weight_block_size": [128, 128],
//     "modules_to_not_convert": [the modules kept]}, in place of any
//     quantization_config before (the other keys of an "fp8" one, such as
//     DeepSeek-V3's "fmt", and its activation_scheme, stay);
//   - where they hold none, without an "fp8" quantization_config (a stale
//     one from an FP8 round before would make transformers read the
//     weights as FP8); another quantization_config stays;
//   - where they hold FP8 tensors of another layout (an FP8 checkpoint
//     sent as it is, whose config describes it), unchanged.
//
// The other keys keep their order and values; a changed config is written
// indented by two spaces, as transformers writes it. An error says config
// is not a JSON object.
func UpdateHFConfig(config []byte, ts []TensorMeta) ([]byte, bool, error) {
	keys, vals, err := jsonObject(config)
	if err != nil {
		return nil, false, fmt.Errorf("config.json: %w", err)
	}
	weights, keep, foreign := FP8Weights(ts)
	if foreign != "" {
		return config, false, nil
	}
	at := slices.Index(keys, HFConfigKey)
	var old map[string]json.RawMessage
	var oldKeys []string
	if at >= 0 {
		if k, v, err := jsonObject(vals[at]); err == nil {
			oldKeys, old = k, map[string]json.RawMessage{}
			for i := range k {
				old[k[i]] = v[i]
			}
		}
	}
	fp8 := old != nil && string(bytes.TrimSpace(old["quant_method"])) == `"fp8"`
	if len(weights) == 0 {
		if at < 0 || !fp8 {
			return config, false, nil
		}
		keys, vals = slices.Delete(keys, at, at+1), slices.Delete(vals, at, at+1)
		return writeJSONObject(keys, vals), true, nil
	}
	qk, qv := []string{}, []json.RawMessage{}
	if fp8 {
		for _, k := range oldKeys {
			qk, qv = append(qk, k), append(qv, old[k])
		}
	}
	set := func(k string, v any) {
		b, _ := json.Marshal(v)
		if i := slices.Index(qk, k); i >= 0 {
			qv[i] = b
			return
		}
		qk, qv = append(qk, k), append(qv, b)
	}
	set("quant_method", "fp8")
	if !slices.Contains(qk, "activation_scheme") {
		set("activation_scheme", "dynamic")
	}
	set("weight_block_size", []int{Block, Block})
	set("modules_to_not_convert", keep)
	q := writeJSONObject(qk, qv)
	if at >= 0 {
		vals[at] = q
	} else {
		keys, vals = append(keys, HFConfigKey), append(vals, q)
	}
	out := writeJSONObject(keys, vals)
	return out, !bytes.Equal(out, config), nil
}

// jsonObject splits a JSON object into its keys, in order, and their raw
// values.
func jsonObject(b []byte) ([]string, []json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, fmt.Errorf("not a JSON object")
	}
	var keys []string
	var vals []json.RawMessage
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, fmt.Errorf("the value of %q: %w", k, err)
		}
		if i := slices.Index(keys, k); i >= 0 { // a repeated key: the last wins, as in Python
			vals[i] = v
			continue
		}
		keys, vals = append(keys, k), append(vals, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, nil, fmt.Errorf("data after the object")
	}
	return keys, vals, nil
}

// writeJSONObject writes the object of keys and values, indented by two
// spaces, with a final newline.
func writeJSONObject(keys []string, vals []json.RawMessage) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vals[i])
	}
	b.WriteByte('}')
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		return append(b.Bytes(), '\n') // the values came from a decoder: not reached
	}
	out.WriteByte('\n')
	return out.Bytes()
}
