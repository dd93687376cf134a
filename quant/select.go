package quant

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/weightcast/weightcast/dtype"
)

// Scheme is a rollout quantization: how the weights a Selector picks are
// turned into other tensors on the way.
type Scheme string

// The schemes.
const (
	// None sends every tensor as it is (the zero Scheme).
	None Scheme = ""
	// FP8Block turns each picked [rows, cols] weight W into W as F8_E4M3
	// and W_scale_inv, F32 [ceil(rows/128), ceil(cols/128)] (package doc).
	FP8Block Scheme = "fp8-block"
)

// ScaleSuffix is appended to a quantized weight's name to name its scales,
// as in the FP8 checkpoints of DeepSeek-V3 and Qwen3-FP8.
const ScaleSuffix = "_scale_inv"

// ParseScheme returns the Scheme spelled s: "fp8-block", or "" and "none"
// for None.
func ParseScheme(s string) (Scheme, error) {
	switch strings.ToLower(s) {
	case "", "none":
		return None, nil
	case string(FP8Block):
		return FP8Block, nil
	}
	return None, fmt.Errorf("quant: unknown quantization scheme %q (known: fp8-block, none)", s)
}

// defaultKeep matches the names of the 2-D weights that stay as they are
// by default: embeddings, norms, the LM head, MoE router gates (DeepSeek's
// and Qwen's mlp.gate, Mixtral's block_sparse_moe.gate, shared expert
// gates, routers), positional and token-type embeddings.
var defaultKeep = regexp.MustCompile(`(^|[._])(embed|embeddings?|embed_tokens|wte|wpe|lm_head|output|norm|[a-z_]*norm[a-z_0-9]*|ln_[a-z0-9_]*|gate|[a-z_]*_gate|router|classifier|score)(\.weight)?$|(^|\.)lm_head\.|(^|\.)embed_tokens\.|(^|\.)(gate|router)\.weight$`)

// Selector decides which tensors a scheme quantizes. By default it picks
// 2-D floating weights (F32, BF16, F16) whose names end in "weight" and
// are not embeddings, norms, the LM head or MoE router gates (1-D tensors,
// such as biases and norms, are never picked by default). Include adds
// tensors whose names match one of its patterns (Go regular expressions,
// matched anywhere in the name unless anchored); Exclude leaves those
// matching one of its patterns as they are, and wins over Include. A
// tensor that Include forces but that cannot be quantized (not 2-D, or
// not of a floating dtype quantization takes) is an error; tensors
// already in FP8 pass through as they are.
type Selector struct {
	include, exclude []*regexp.Regexp
}

// NewSelector compiles the patterns.
func NewSelector(include, exclude []string) (*Selector, error) {
	s := &Selector{}
	for _, p := range include {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("quant: include pattern %q: %w", p, err)
		}
		s.include = append(s.include, re)
	}
	for _, p := range exclude {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("quant: exclude pattern %q: %w", p, err)
		}
		s.exclude = append(s.exclude, re)
	}
	return s, nil
}

func matchAny(res []*regexp.Regexp, name string) bool {
	for _, re := range res {
		if re.MatchString(name) {
			return true
		}
	}
	return false
}

// Default reports whether the default rule picks a tensor: 2-D, F32, BF16
// or F16, a name ending in "weight" that is not an embedding, a norm, the
// LM head or a router gate.
func Default(name string, d dtype.DType, shape []int64) bool {
	return len(shape) == 2 && Sources(d) && strings.HasSuffix(name, "weight") && !defaultKeep.MatchString(name)
}

// Select reports whether the tensor is quantized, or why a tensor that an
// Include pattern forces cannot be.
func (s *Selector) Select(name string, d dtype.DType, shape []int64) (bool, error) {
	if matchAny(s.exclude, name) {
		return false, nil
	}
	if !matchAny(s.include, name) {
		return Default(name, d, shape), nil
	}
	switch {
	case d == dtype.F8E4M3 || d == dtype.F8E5M2:
		return false, nil // already FP8: sent as it is
	case !Sources(d):
		return false, fmt.Errorf("quant: tensor %q is %s; an include pattern picked it, but only F32, BF16 and F16 weights can be quantized", name, d)
	case len(shape) != 2:
		return false, fmt.Errorf("quant: tensor %q has shape %v; an include pattern picked it, but block-scaled FP8 takes 2-D weights [rows, cols] only", name, shape)
	}
	return true, nil
}
