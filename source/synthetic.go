package source

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/stages"
)

// Synthetic describes a deterministic, transformer-shaped model: token
// embeddings and an LM head (each about a quarter of the bytes, like the
// large-vocabulary models RL post-training uses, so at the usual bucket sizes
// they are split across buckets), per-layer attention and MLP projections
// and norms, a final norm, and one zero-element tensor. The bytes of every
// tensor are generated on demand from Seed, so the model is never held in
// memory and any rank can regenerate any byte to verify it.
type Synthetic struct {
	// Size is the approximate total size in bytes.
	Size int64
	// Tensors is the number of tensors (at least 1).
	Tensors int
	// DTypes is the dtype mix: tensor i takes DTypes[i % len(DTypes)] for
	// the projections, norms take the first floating type from the list
	// that is 4 bytes or wider, else DTypes[0]. Empty means BF16.
	DTypes []dtype.DType
	// Seed selects the bytes.
	Seed uint64
}

// Model lays out the tensors. The result is a stages.Source and a
// stages.Lookuper.
func (s Synthetic) Model() (*SyntheticModel, error) {
	if s.Tensors < 1 {
		return nil, fmt.Errorf("synthetic model needs at least 1 tensor, got %d", s.Tensors)
	}
	if s.Size < 0 {
		return nil, fmt.Errorf("synthetic model size %d is negative", s.Size)
	}
	mix := s.DTypes
	if len(mix) == 0 {
		mix = []dtype.DType{dtype.BF16}
	}
	for _, d := range mix {
		if !d.Valid() {
			return nil, fmt.Errorf("synthetic model: invalid dtype %v in the mix", d)
		}
	}
	norm := mix[0]
	for _, d := range mix {
		if d.IsFloat() && d.Size() >= 4 {
			norm = d
			break
		}
	}
	// Average element width of the projections, to turn bytes into
	// element counts.
	avg := 0.0
	for _, d := range mix {
		avg += float64(d.Size())
	}
	avg /= float64(len(mix))

	layers := max(0, (s.Tensors-4)/9)
	extra := max(0, s.Tensors-4-9*layers)
	elems := float64(s.Size) / avg
	// hidden h, intermediate 8h/3, vocab chosen so embeddings and head
	// take about 27% of the elements each, layers the rest.
	var h int64
	if layers > 0 {
		h = int64(math.Sqrt(0.46 * elems / (float64(layers) * 12)))
	} else {
		h = int64(math.Sqrt(0.27 * elems / 32))
	}
	h = max(8, h/8*8)
	inter := max(8, (8*h/3)/8*8)
	vocab := max(1, int64(0.27*elems)/h)

	m := &SyntheticModel{seed: s.Seed, byName: map[string]int{}}
	pick := func(i int) dtype.DType { return mix[i%len(mix)] }
	add := func(name string, dt dtype.DType, shape ...int64) {
		m.list = append(m.list, &stages.Tensor{Name: name, DType: dt, Shape: shape, Reader: genReader{seed: s.Seed, id: uint64(len(m.list))}})
	}
	add("model.embed_tokens.weight", pick(0), vocab, h)
	for l := range layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", norm, h)
		add(p+"self_attn.q_proj.weight", pick(9*l+1), h, h)
		add(p+"self_attn.k_proj.weight", pick(9*l+2), h, h)
		add(p+"self_attn.v_proj.weight", pick(9*l+3), h, h)
		add(p+"self_attn.o_proj.weight", pick(9*l+4), h, h)
		add(p+"post_attention_layernorm.weight", norm, h)
		add(p+"mlp.gate_proj.weight", pick(9*l+5), inter, h)
		add(p+"mlp.up_proj.weight", pick(9*l+6), inter, h)
		add(p+"mlp.down_proj.weight", pick(9*l+7), h, inter)
	}
	for i := range extra {
		add(fmt.Sprintf("model.layers.%d.self_attn.qkv_bias.%d", i%max(1, layers), i), norm, h)
	}
	add("model.norm.weight", norm, h)
	add("model.rotary_emb.unused_cache", norm, 0, h) // zero elements, as some checkpoints carry
	add("lm_head.weight", pick(1), vocab, h)
	if len(m.list) > s.Tensors {
		m.list = m.list[:s.Tensors]
	}
	for i, t := range m.list {
		m.byName[t.Name] = i
		n, err := t.Size()
		if err != nil {
			return nil, err
		}
		m.size += n
	}
	return m, nil
}

// SyntheticModel is a laid-out Synthetic model.
type SyntheticModel struct {
	seed   uint64
	list   []*stages.Tensor
	byName map[string]int
	size   int64
}

// Tensors emits the model's tensors in order.
func (m *SyntheticModel) Tensors(ctx context.Context, emit func(*stages.Tensor) error) error {
	for _, t := range m.list {
		if err := emit(t); err != nil {
			return err
		}
	}
	return nil
}

// List returns the model's tensors in order.
func (m *SyntheticModel) List() []*stages.Tensor { return m.list }

// Size is the model's exact total size in bytes.
func (m *SyntheticModel) Size() int64 { return m.size }

// Lookup returns the tensor called name.
func (m *SyntheticModel) Lookup(name string) (*stages.Tensor, bool) {
	i, ok := m.byName[name]
	if !ok {
		return nil, false
	}
	return m.list[i], true
}

// genReader generates a tensor's bytes: word k (8 bytes, little-endian) is
// splitmix64 of (seed, tensor id, k), so any range can be produced alone.
type genReader struct{ seed, id uint64 }

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (g genReader) word(k uint64) uint64 { return splitmix(g.seed ^ g.id<<40 ^ k) }

// ReadAt fills p with the bytes at off.
func (g genReader) ReadAt(p []byte, off int64) (int, error) {
	n := len(p)
	k := uint64(off) / 8
	if skip := int(off % 8); skip != 0 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], g.word(k))
		c := copy(p, w[skip:])
		p, k = p[c:], k+1
	}
	for len(p) >= 8 {
		binary.LittleEndian.PutUint64(p, g.word(k))
		p, k = p[8:], k+1
	}
	if len(p) > 0 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], g.word(k))
		copy(p, w[:])
	}
	return n, nil
}
