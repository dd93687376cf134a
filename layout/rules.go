package layout

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Kind says how a tensor is split over tensor-parallel (and expert-parallel)
// ranks; each follows the vLLM layer that loads such a tensor.
type Kind uint8

const (
	// Replicated: every rank needs the whole tensor (ReplicatedLinear,
	// norms, MoE router gates, DeepSeek's q_a_proj and kv_a_proj_with_mqa).
	Replicated Kind = iota + 1
	// Column: dim 0 split evenly over the TP ranks (ColumnParallelLinear,
	// each part of MergedColumnParallelLinear: gate_proj, up_proj; biases
	// too).
	Column
	// Row: dim 1 split evenly over the TP ranks (RowParallelLinear); a
	// one-dimensional tensor (its bias) is replicated.
	Row
	// Vocab: dim 0 is the vocabulary, padded to a multiple of 64 and split
	// evenly over the TP ranks, each rank keeping the real rows of its range
	// (VocabParallelEmbedding, ParallelLMHead).
	Vocab
	// Query: the q part of QKVParallelLinear: the query heads split evenly
	// over the TP ranks (as Column, and the head count must divide).
	Query
	// KeyValue: the k or v part of QKVParallelLinear: the kv heads split
	// evenly; when there are fewer kv heads than TP ranks each rank takes
	// one head, head r / (T / kv heads), so that T / kv heads ranks share
	// each (GQA replication).
	KeyValue
	// ExpertColumn: a routed expert's gate or up projection
	// (experts.N.gate_proj): under expert parallelism the expert-parallel
	// rank that owns expert N needs it whole, the others nothing; without
	// it, split as Column.
	ExpertColumn
	// ExpertRow: a routed expert's down projection: whole on its
	// expert-parallel rank, or split as Row without expert parallelism.
	ExpertRow
	// Skip: no receiver needs the tensor (rotary_emb.inv_freq, which vLLM
	// recomputes).
	Skip
)

var kindNames = map[Kind]string{
	Replicated: "replicated", Column: "column", Row: "row", Vocab: "vocab", Query: "q",
	KeyValue: "kv", ExpertColumn: "expert-column", ExpertRow: "expert-row", Skip: "skip",
}

// String returns the kind's name as ParseKind reads it.
func (k Kind) String() string {
	if n, ok := kindNames[k]; ok {
		return n
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// ParseKind reads a kind's name: replicated, column, row, vocab, q, kv,
// expert-column, expert-row, skip.
func ParseKind(s string) (Kind, error) {
	for k, n := range kindNames {
		if n == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown kind %q (want one of replicated, column, row, vocab, q, kv, expert-column, expert-row, skip)", s)
}

// Model holds the head and expert counts that some kinds need.
type Model struct {
	Heads   int // attention (query) heads, for Query
	KVHeads int // key/value heads, for KeyValue
	Experts int // routed experts, for ExpertColumn and ExpertRow under expert parallelism
}

// Coord is a receiver's place in its replica: TP rank of TPSize, and EP
// rank of EPSize (EPSize 1 or 0: no expert parallelism). The zero value is
// a rank that needs whole tensors.
type Coord struct {
	TPRank, TPSize int
	EPRank, EPSize int
}

func (c Coord) tp() (int, int) {
	if c.TPSize <= 1 {
		return 0, 1
	}
	return c.TPRank, c.TPSize
}

// Rule maps tensor names that match Pattern (a Go regular expression,
// unanchored) to a Kind.
type Rule struct {
	Pattern string
	Kind    Kind
}

// ParseRule reads "PATTERN=KIND", the last '=' separating them.
func ParseRule(s string) (Rule, error) {
	i := strings.LastIndexByte(s, '=')
	if i <= 0 {
		return Rule{}, fmt.Errorf("rule %q: want PATTERN=KIND", s)
	}
	k, err := ParseKind(s[i+1:])
	if err != nil {
		return Rule{}, fmt.Errorf("rule %q: %w", s, err)
	}
	return Rule{Pattern: s[:i], Kind: k}, nil
}

// Rules is an ordered rule set: the first rule whose pattern matches a name
// gives its kind.
type Rules struct {
	rules []Rule
	res   []*regexp.Regexp
}

// NewRules compiles rules, in order.
func NewRules(rules ...Rule) (*Rules, error) {
	rs := &Rules{}
	for _, r := range rules {
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return nil, fmt.Errorf("rule %s=%s: %w", r.Pattern, r.Kind, err)
		}
		if _, ok := kindNames[r.Kind]; !ok {
			return nil, fmt.Errorf("rule %s: %v is not a kind", r.Pattern, r.Kind)
		}
		rs.rules = append(rs.rules, r)
		rs.res = append(rs.res, re)
	}
	return rs, nil
}

// With returns a rule set that tries user rules first, then rs's.
func (rs *Rules) With(user ...Rule) (*Rules, error) {
	return NewRules(append(append([]Rule(nil), user...), rs.rules...)...)
}

// List returns the rules in the order they are tried.
func (rs *Rules) List() []Rule { return append([]Rule(nil), rs.rules...) }

// defaultRules follow vLLM's loaders for Llama (llama.py), Qwen2/3 and their
// MoE variants (qwen2.py, qwen3.py, qwen2_moe.py, qwen3_moe.py) and
// DeepSeek-V2/V3, Kimi-K2 (deepseek_v2.py), with the layers of linear.py
// and vocab_parallel_embedding.py.
var defaultRules = []Rule{
	{`\.experts\.\d+\.(gate_proj|up_proj|w1|w3)\.weight$`, ExpertColumn},
	{`\.experts\.\d+\.(down_proj|w2)\.weight$`, ExpertRow},
	{`(^|\.)(embed_tokens|lm_head)\.weight$`, Vocab},
	{`\.self_attn\.q_proj\.(weight|bias)$`, Query},
	{`\.self_attn\.(k_proj|v_proj)\.(weight|bias)$`, KeyValue},
	{`\.self_attn\.(q_b_proj|kv_b_proj)\.weight$`, Column},
	{`\.self_attn\.(q_a_proj|kv_a_proj_with_mqa)\.weight$`, Replicated},
	{`\.self_attn\.o_proj\.(weight|bias)$`, Row},
	{`\.mlp\.(shared_experts?\.)?(gate_proj|up_proj)\.(weight|bias)$`, Column},
	{`\.mlp\.(shared_experts?\.)?down_proj\.(weight|bias)$`, Row},
	{`(norm|layernorm)\.(weight|bias)$`, Replicated},
	{`\.mlp\.gate\.(weight|e_score_correction_bias)$`, Replicated},
	{`\.mlp\.shared_expert_gate\.weight$`, Replicated},
	{`rotary_emb\.inv_freq$`, Skip},
}

// DefaultRules returns the rule set for Llama, Qwen2/3 (dense and MoE) and
// DeepSeek-V3/Kimi-K2 names, as vLLM slices them at tensor parallelism.
func DefaultRules() *Rules {
	rs, err := NewRules(defaultRules...)
	if err != nil {
		panic(err)
	}
	return rs
}

// Kind returns the kind of the first rule that matches name.
func (rs *Rules) Kind(name string) (Kind, error) {
	for i, re := range rs.res {
		if re.MatchString(name) {
			return rs.rules[i].Kind, nil
		}
	}
	return 0, fmt.Errorf("tensor %s: no rule says how to split it; add one (PATTERN=KIND)", name)
}

var expertIndex = regexp.MustCompile(`\.experts\.(\d+)\.`)

// ExpertIndex returns N of a name with ".experts.N.", and false for other
// names.
func ExpertIndex(name string) (int, bool) {
	m := expertIndex.FindStringSubmatch(name)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}

// ExpertRange returns the experts [lo, hi) that EP rank e of size owns of n
// experts: n/size each, the first n%size ranks one more (vLLM's linear
// expert placement).
func ExpertRange(n, e, size int) (lo, hi int) {
	base, rem := n/size, n%size
	lo = e*base + min(e, rem)
	hi = lo + base
	if e < rem {
		hi++
	}
	return lo, hi
}

// Need returns the slice of t that the rank at c needs when t is split as
// k, and false when it needs none of t.
func (k Kind) Need(t Tensor, c Coord, m Model) (Slice, bool, error) {
	full := Full(t.Shape)
	r, n := c.tp()
	split := func(dim int, parts int64, part int64) (Slice, bool, error) {
		if len(t.Shape) <= dim {
			return Slice{}, false, fmt.Errorf("tensor %s: kind %v splits dim %d of a %d-dimensional tensor", t.Name, k, dim, len(t.Shape))
		}
		if t.Shape[dim]%parts != 0 {
			return Slice{}, false, fmt.Errorf("tensor %s: kind %v splits dim %d of size %d into %d parts, which does not divide", t.Name, k, dim, t.Shape[dim], parts)
		}
		per := t.Shape[dim] / parts
		full.Offset[dim], full.Size[dim] = part*per, per
		return full, true, nil
	}
	switch k {
	case Skip:
		return Slice{}, false, nil
	case Replicated:
		return full, true, nil
	case Column:
		return split(0, int64(n), int64(r))
	case Row:
		if len(t.Shape) < 2 {
			return full, true, nil
		}
		return split(1, int64(n), int64(r))
	case Query:
		if m.Heads > 0 && m.Heads%n != 0 {
			return Slice{}, false, fmt.Errorf("tensor %s: %d query heads do not split over %d TP ranks", t.Name, m.Heads, n)
		}
		return split(0, int64(n), int64(r))
	case KeyValue:
		kv := m.KVHeads
		if kv <= 0 {
			return Slice{}, false, fmt.Errorf("tensor %s: kind kv needs the number of key/value heads", t.Name)
		}
		if len(t.Shape) == 0 || t.Shape[0]%int64(kv) != 0 {
			return Slice{}, false, fmt.Errorf("tensor %s: dim 0 (%v) is not %d kv heads", t.Name, t.Shape, kv)
		}
		if n >= kv {
			if n%kv != 0 {
				return Slice{}, false, fmt.Errorf("tensor %s: %d TP ranks are not a multiple of %d kv heads", t.Name, n, kv)
			}
			return split(0, int64(kv), int64(r/(n/kv)))
		}
		if kv%n != 0 {
			return Slice{}, false, fmt.Errorf("tensor %s: %d kv heads do not split over %d TP ranks", t.Name, kv, n)
		}
		return split(0, int64(n), int64(r))
	case Vocab:
		if len(t.Shape) == 0 {
			return Slice{}, false, fmt.Errorf("tensor %s: kind vocab on a scalar", t.Name)
		}
		v := t.Shape[0]
		padded := (v + 63) / 64 * 64
		if padded%int64(n) != 0 {
			return Slice{}, false, fmt.Errorf("tensor %s: the padded vocabulary %d does not split over %d TP ranks", t.Name, padded, n)
		}
		per := padded / int64(n)
		lo := min(int64(r)*per, v)
		hi := min(lo+per, v)
		if hi <= lo {
			return Slice{}, false, nil
		}
		full.Offset[0], full.Size[0] = lo, hi-lo
		return full, true, nil
	case ExpertColumn, ExpertRow:
		if c.EPSize > 1 {
			i, ok := ExpertIndex(t.Name)
			if !ok {
				return Slice{}, false, fmt.Errorf("tensor %s: kind %v but no .experts.N. in the name", t.Name, k)
			}
			if m.Experts <= 0 || i >= m.Experts {
				return Slice{}, false, fmt.Errorf("tensor %s: expert %d, of %d experts", t.Name, i, m.Experts)
			}
			lo, hi := ExpertRange(m.Experts, c.EPRank, c.EPSize)
			return full, i >= lo && i < hi, nil
		}
		if k == ExpertColumn {
			return Column.Need(t, c, m)
		}
		return Row.Need(t, c, m)
	}
	return Slice{}, false, fmt.Errorf("tensor %s: %v is not a kind", t.Name, k)
}
