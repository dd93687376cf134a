package route

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/layout"
)

// Shard is one slice of a global tensor as a sender holds it: the
// tensor's name, dtype and global shape, and the rectangular region held
// (Offset and Size per dimension; nil Offset and Size: the whole tensor).
// Its local tensor is that region, contiguous, row-major.
type Shard struct {
	Name   string
	DType  dtype.DType
	Shape  []int64 // the global shape
	Offset []int64
	Size   []int64
}

// Slice returns the region the shard holds.
func (s Shard) Slice() layout.Slice {
	if s.Offset == nil && s.Size == nil {
		return layout.Full(s.Shape)
	}
	return layout.Slice{Offset: s.Offset, Size: s.Size}
}

// Tensor returns the global tensor the shard is a slice of.
func (s Shard) Tensor() layout.Tensor {
	return layout.Tensor{Name: s.Name, DType: s.DType, Shape: s.Shape}
}

// Bytes returns the size of the shard's local tensor.
func (s Shard) Bytes() int64 { return s.Slice().Elements() * int64(s.DType.Size()) }

// Need is what a receiver rank asks for: every tensor whole (the zero
// Need), its tensor-parallel shard (TP > 1: rank TPRank of TP, sliced by
// the default rules of package layout, as vLLM's loaders slice), or an
// explicit list of shards.
type Need struct {
	TP, TPRank int
	// Model holds the head counts that query and key/value projections
	// are split by.
	Model layout.Model
	// Rules are tried before layout.DefaultRules, for names the default
	// rules do not know or split otherwise.
	Rules []layout.Rule
	// Shards, when set, lists the slices needed; TP is then ignored.
	Shards []Shard
}

// Validate reports a Need that cannot describe a receiver.
func (n Need) Validate() error {
	switch {
	case n.Shards != nil:
		return checkShards(n.Shards)
	case n.TP < 0:
		return fmt.Errorf("tensor-parallel size %d: give 1 or more", n.TP)
	case n.TPRank < 0 || n.TPRank >= max(n.TP, 1):
		return fmt.Errorf("tensor-parallel rank %d outside [0, %d)", n.TPRank, max(n.TP, 1))
	}
	if _, err := layout.DefaultRules().With(n.Rules...); err != nil {
		return err
	}
	return nil
}

// String says what the need is, for people.
func (n Need) String() string {
	switch {
	case n.Shards != nil:
		return fmt.Sprintf("%d explicit shards", len(n.Shards))
	case n.TP > 1:
		return fmt.Sprintf("tensor-parallel rank %d of %d", n.TPRank, n.TP)
	}
	return "every tensor whole"
}

// checkShards reports shards that are malformed or repeat a tensor's
// slice.
func checkShards(shards []Shard) error {
	type key struct {
		name string
		s    string
	}
	seen := map[key]bool{}
	for _, s := range shards {
		t := s.Tensor()
		if err := t.Validate(); err != nil {
			return err
		}
		sl := s.Slice()
		if len(sl.Offset) != len(s.Shape) || len(sl.Size) != len(s.Shape) {
			return fmt.Errorf("tensor %s: a slice of %d offsets and %d sizes for a shape of %d dimensions", s.Name, len(sl.Offset), len(sl.Size), len(s.Shape))
		}
		for d := range s.Shape {
			if sl.Offset[d] < 0 || sl.Size[d] < 0 || sl.Offset[d]+sl.Size[d] > s.Shape[d] {
				return fmt.Errorf("tensor %s: slice %v outside its shape %v", s.Name, sl, s.Shape)
			}
		}
		k := key{s.Name, sl.String()}
		if seen[k] {
			return fmt.Errorf("tensor %s: slice %v given twice", s.Name, sl)
		}
		seen[k] = true
	}
	return nil
}

// declaration is what one rank publishes about its layout: a sender's
// shards, or a receiver's need. Its canonical JSON is what the digest
// covers.
type declaration struct {
	Shards []shardJSON   `json:"shards,omitempty"`
	TP     int           `json:"tp,omitempty"`
	TPRank int           `json:"tp_rank,omitempty"`
	Model  *layout.Model `json:"model,omitempty"`
	Rules  []string      `json:"rules,omitempty"`
	Whole  bool          `json:"whole,omitempty"`
}

type shardJSON struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Offset []int64 `json:"offset"`
	Size   []int64 `json:"size"`
}

// maxDeclaration bounds a decoded declaration: 64 MiB.
const maxDeclaration = 64 << 20

// declareShards returns a sender's declaration of shards, sorted by name
// and offset so that the same shards give the same digest in any order.
func declareShards(shards []Shard) declaration {
	out := make([]shardJSON, len(shards))
	for i, s := range shards {
		sl := s.Slice()
		out[i] = shardJSON{Name: s.Name, DType: s.DType.String(), Shape: nonNil(s.Shape), Offset: nonNil(sl.Offset), Size: nonNil(sl.Size)}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return slices.Compare(out[i].Offset, out[j].Offset) < 0
	})
	return declaration{Shards: out}
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

// declareNeed returns a receiver's declaration of n.
func declareNeed(n Need) declaration {
	switch {
	case n.Shards != nil:
		return declareShards(n.Shards)
	case n.TP > 1:
		d := declaration{TP: n.TP, TPRank: n.TPRank}
		for _, r := range n.Rules {
			d.Rules = append(d.Rules, r.Pattern+"="+r.Kind.String())
		}
		if n.Model != (layout.Model{}) {
			m := n.Model
			d.Model = &m
		}
		return d
	}
	return declaration{Whole: true}
}

// encode returns d's canonical JSON and its digest.
func (d declaration) encode() ([]byte, string) {
	b, err := json.Marshal(d)
	if err != nil {
		panic(err) // plain fields only
	}
	sum := sha256.Sum256(b)
	return b, hex.EncodeToString(sum[:])
}

// decodeDeclaration parses a published declaration and checks it against
// digest.
func decodeDeclaration(b []byte, digest string) (declaration, error) {
	var d declaration
	if len(b) > maxDeclaration {
		return d, fmt.Errorf("a layout of %d bytes exceeds the %d-byte limit", len(b), maxDeclaration)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != digest {
		return d, fmt.Errorf("a layout whose digest is not the published %s", digest)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return d, fmt.Errorf("a malformed layout: %w", err)
	}
	return d, nil
}

// rules returns d's rule set: its own rules before the default ones.
func (d declaration) rules() (*layout.Rules, error) {
	user := make([]layout.Rule, len(d.Rules))
	for i, r := range d.Rules {
		var err error
		if user[i], err = layout.ParseRule(r); err != nil {
			return nil, err
		}
	}
	return layout.DefaultRules().With(user...)
}

// shards returns d's shards.
func (d declaration) shards() ([]Shard, error) {
	out := make([]Shard, len(d.Shards))
	for i, s := range d.Shards {
		dt, err := dtype.Parse(s.DType)
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", s.Name, err)
		}
		out[i] = Shard{Name: s.Name, DType: dt, Shape: s.Shape, Offset: s.Offset, Size: s.Size}
	}
	return out, checkShards(out)
}

// layouts builds the senders' and the receivers' layout.Layout from every
// rank's declaration (decls[rank]; ranks [0, senders) send): the senders'
// tensors are the union of their shards' tensors, which must agree on
// dtype and shape; receivers with a tensor-parallel need take the slices
// layout.DefaultRules give them of those tensors.
func layouts(decls []declaration, senders int) (snd, rcv *layout.Layout, err error) {
	snd = &layout.Layout{Ranks: make([][]layout.Piece, senders)}
	index := map[string]int{}
	for r := range senders {
		shards, err := decls[r].shards()
		if err != nil {
			return nil, nil, fmt.Errorf("sender rank %d's layout: %w", r, err)
		}
		for _, s := range shards {
			t := s.Tensor()
			i, ok := index[t.Name]
			if !ok {
				i = len(snd.TensorList)
				index[t.Name] = i
				snd.TensorList = append(snd.TensorList, t)
			} else if o := snd.TensorList[i]; o.DType != t.DType || !slices.Equal(o.Shape, t.Shape) {
				return nil, nil, fmt.Errorf("tensor %s: sender rank %d holds it as %v %v, another sender as %v %v: every sender must agree on a tensor's dtype and global shape", t.Name, r, t.DType, t.Shape, o.DType, o.Shape)
			}
			snd.Ranks[r] = append(snd.Ranks[r], layout.Piece{Tensor: i, Slice: s.Slice()})
		}
	}
	if err := snd.Validate(); err != nil {
		return nil, nil, fmt.Errorf("the senders' layout: %w", err)
	}
	rcv = &layout.Layout{TensorList: snd.TensorList, Ranks: make([][]layout.Piece, len(decls)-senders)}
	for i, d := range decls[senders:] {
		rank := senders + i
		switch {
		case d.Whole:
			for t, tensor := range snd.TensorList {
				rcv.Ranks[i] = append(rcv.Ranks[i], layout.Piece{Tensor: t, Slice: layout.Full(tensor.Shape)})
			}
		case d.TP > 1:
			var m layout.Model
			if d.Model != nil {
				m = *d.Model
			}
			c := layout.Coord{TPRank: d.TPRank, TPSize: d.TP, EPSize: 1}
			rules, err := d.rules()
			if err != nil {
				return nil, nil, fmt.Errorf("receiver rank %d: %w", rank, err)
			}
			for t, tensor := range snd.TensorList {
				k, err := rules.Kind(tensor.Name)
				if err != nil {
					return nil, nil, fmt.Errorf("receiver rank %d: %w", rank, err)
				}
				s, ok, err := k.Need(tensor, c, m)
				if err != nil {
					return nil, nil, fmt.Errorf("receiver rank %d (tensor-parallel rank %d of %d): tensor %s: %w", rank, d.TPRank, d.TP, tensor.Name, err)
				}
				if ok {
					rcv.Ranks[i] = append(rcv.Ranks[i], layout.Piece{Tensor: t, Slice: s})
				}
			}
		default:
			shards, err := d.shards()
			if err != nil {
				return nil, nil, fmt.Errorf("receiver rank %d's layout: %w", rank, err)
			}
			for _, s := range shards {
				t, ok := index[s.Name]
				if !ok {
					return nil, nil, fmt.Errorf("receiver rank %d needs tensor %s, which no sender holds", rank, s.Name)
				}
				if o := rcv.TensorList[t]; o.DType != s.DType || !slices.Equal(o.Shape, s.Shape) {
					return nil, nil, fmt.Errorf("tensor %s: receiver rank %d needs it as %v %v, the senders hold %v %v", s.Name, rank, s.DType, s.Shape, o.DType, o.Shape)
				}
				rcv.Ranks[i] = append(rcv.Ranks[i], layout.Piece{Tensor: t, Slice: s.Slice()})
			}
		}
	}
	if err := rcv.Validate(); err != nil {
		return nil, nil, fmt.Errorf("the receivers' layout: %w", err)
	}
	return snd, rcv, nil
}
