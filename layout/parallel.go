package layout

import (
	"errors"
	"fmt"
	"iter"
)

// Spec is a group's parallelism. Its ranks form groups of G = max(TP, EP)
// consecutive ranks; in a group, rank g has TP rank g % TP and, under
// expert parallelism, EP rank g (vLLM numbers EP ranks over DP × TP). With
// FSDP the groups are the FSDP shards of one copy: group k of F = Ranks/G
// holds dim-0 chunk k (torch.chunk) of its TP/EP slice of every tensor.
// Without FSDP every group is a replica that needs its slices whole.
type Spec struct {
	Ranks int
	TP    int  // tensor-parallel size, 1 or 0 for none
	EP    int  // expert-parallel size, 1 or 0 for none, else max(TP, EP) ranks per group
	FSDP  bool // the groups shard one copy along dim 0 (a trainer); false: replicas (a rollout)
}

// GroupSize returns max(TP, EP), at least 1.
func (s Spec) GroupSize() int { return max(s.TP, s.EP, 1) }

// Validate reports a spec whose sizes do not fit together.
func (s Spec) Validate() error {
	g := s.GroupSize()
	switch {
	case s.Ranks <= 0:
		return errors.New("ranks must be at least 1")
	case s.TP < 0 || s.EP < 0:
		return errors.New("TP and EP sizes must not be negative")
	case s.Ranks%g != 0:
		return fmt.Errorf("%d ranks are not a multiple of the group size %d (max of TP %d, EP %d)", s.Ranks, g, s.TP, s.EP)
	case s.EP > 1 && s.EP < s.TP:
		return fmt.Errorf("EP %d is smaller than TP %d: the EP ranks of a group are its ranks, so EP must be at least TP", s.EP, s.TP)
	case g%max(s.TP, 1) != 0:
		return fmt.Errorf("EP %d is not a multiple of TP %d", s.EP, s.TP)
	}
	return nil
}

// Coord returns the TP/EP coordinates of rank i and its group index.
func (s Spec) Coord(i int) (Coord, int) {
	g := s.GroupSize()
	in := i % g
	c := Coord{TPRank: in % max(s.TP, 1), TPSize: max(s.TP, 1), EPSize: max(s.EP, 1)}
	if c.EPSize > 1 {
		c.EPRank = in
	}
	return c, i / g
}

// Parallel is a Source whose slices follow a Spec and a rule set, computed
// on demand rather than stored per rank.
type Parallel struct {
	spec    Spec
	tensors []Tensor
	kinds   []Kind
	experts []int // the expert index of each expert tensor, else -1
	model   Model
}

// NewParallel resolves every tensor's kind with rules and checks that every
// rank's slice can be computed; the error names the tensor.
func NewParallel(tensors []Tensor, rules *Rules, m Model, s Spec) (*Parallel, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if rules == nil {
		rules = DefaultRules()
	}
	p := &Parallel{spec: s, tensors: tensors, model: m, kinds: make([]Kind, len(tensors)), experts: make([]int, len(tensors))}
	seen := make(map[string]bool, len(tensors))
	for i, t := range tensors {
		if err := t.Validate(); err != nil {
			return nil, err
		}
		if seen[t.Name] {
			return nil, fmt.Errorf("tensor %s is listed twice", t.Name)
		}
		seen[t.Name] = true
		k, err := rules.Kind(t.Name)
		if err != nil {
			return nil, err
		}
		p.kinds[i] = k
		p.experts[i] = -1
		if k == ExpertColumn || k == ExpertRow {
			if e, ok := ExpertIndex(t.Name); ok {
				p.experts[i] = e
			}
		}
		// The slices depend on the TP rank, and for experts under expert
		// parallelism on the expert's index: checking the first EP rank
		// checks the index.
		for g := range max(s.TP, 1) {
			c, _ := s.Coord(g)
			if _, _, err := k.Need(t, c, m); err != nil {
				return nil, err
			}
		}
	}
	return p, nil
}

// Spec returns the parallelism p follows.
func (p *Parallel) Spec() Spec { return p.spec }

// Kind returns the kind of tensor t.
func (p *Parallel) Kind(t int) Kind { return p.kinds[t] }

// NumRanks returns the spec's number of ranks.
func (p *Parallel) NumRanks() int { return p.spec.Ranks }

// Tensors returns the tensors.
func (p *Parallel) Tensors() []Tensor { return p.tensors }

// Slice returns rank i's slice of tensor t, and false when it has none.
func (p *Parallel) Slice(t, i int) (Slice, bool) {
	for r, s := range p.Pieces(t) {
		if r == i {
			return s.Clone(), true
		}
		if r > i {
			break
		}
	}
	return Slice{}, false
}

// Pieces yields every rank's slice of tensor t in rank order; the yielded
// Slice is reused.
func (p *Parallel) Pieces(t int) iter.Seq2[int, Slice] {
	return func(yield func(int, Slice) bool) {
		s := p.spec
		g := s.GroupSize()
		groups, has := p.groupSlices(t)
		f := s.Ranks / g
		var buf Slice
		for i := range s.Ranks {
			in, k := i%g, i/g
			if !has[in] {
				continue
			}
			if !s.FSDP {
				if !yield(i, groups[in]) {
					return
				}
				continue
			}
			if !chunkInto(&buf, groups[in], k, f) {
				continue
			}
			if !yield(i, buf) {
				return
			}
		}
	}
}

// groupSlices returns the slice of tensor t that each rank of a group
// needs, computing each distinct slice once: experts under expert
// parallelism go whole to their owner, other kinds depend on the TP rank
// only.
func (p *Parallel) groupSlices(t int) ([]Slice, []bool) {
	s, tn, k := p.spec, p.tensors[t], p.kinds[t]
	g := s.GroupSize()
	groups := make([]Slice, g)
	has := make([]bool, g)
	if (k == ExpertColumn || k == ExpertRow) && max(s.EP, 1) > 1 {
		full := Full(tn.Shape)
		for in := range g {
			c, _ := s.Coord(in)
			lo, hi := ExpertRange(p.model.Experts, c.EPRank, c.EPSize)
			if e := p.experts[t]; e >= lo && e < hi {
				groups[in], has[in] = full, true
			}
		}
		return groups, has
	}
	tp := max(s.TP, 1)
	for r := range tp {
		c, _ := s.Coord(r)
		groups[r], has[r], _ = k.Need(tn, c, p.model)
	}
	for in := tp; in < g; in++ {
		groups[in], has[in] = groups[in%tp], has[in%tp]
	}
	return groups, has
}

// chunkInto writes ChunkDim0(s, i, n) into dst, reusing its memory.
func chunkInto(dst *Slice, s Slice, i, n int) bool {
	if len(s.Size) == 0 {
		*dst = s
		return i == 0
	}
	rows := s.Size[0]
	chunk := (rows + int64(n) - 1) / int64(n)
	lo := min(int64(i)*chunk, rows)
	hi := min(lo+chunk, rows)
	if hi <= lo {
		return false
	}
	dst.Offset = append(dst.Offset[:0], s.Offset...)
	dst.Size = append(dst.Size[:0], s.Size...)
	dst.Offset[0] += lo
	dst.Size[0] = hi - lo
	return true
}
