package plan

import (
	"cmp"
	"fmt"
	"iter"
	"slices"

	"github.com/weightcast/weightcast/layout"
)

// Holder is a sender that holds a region, and the slice it holds: its
// local tensor.
type Holder struct {
	Sender int
	Held   layout.Slice
}

// Region is one rectangular region a receiver needs, with the senders that
// hold it. A Group's regions are the same for each of its tensors.
type Region struct {
	Receiver int
	Need     layout.Slice // the receiver's local slice the region lies in
	Region   layout.Slice // global coordinates
	Holders  []Holder     // by sender rank; one when the region has a single holder
	choice   int          // column in Group.choices, or -1 with a single holder
}

// Group is a set of tensors with the same dtype, shape, holders' slices and
// receivers' slices, and so the same regions.
type Group struct {
	Tensors []int // indices into Plan.Tensors, ascending
	Regions []Region
	// choices[j][k] is the index in Holders of the sender chosen for the
	// k-th region with several holders, for tensor Tensors[j].
	choices [][]int
}

// Plan says which sender sends which region to which receiver.
type Plan struct {
	Senders, Receivers int
	Tensors            []layout.Tensor // the receivers' tensors
	Groups             []Group
	Links              Links
	Stats              Stats

	senderFP, receiverFP [32]byte
	digest               [32]byte
}

// Move is one region of one tensor from one sender to one receiver.
type Move struct {
	Tensor   int // index into Plan.Tensors
	Sender   int
	Receiver int
	Held     layout.Slice // the sender's local slice
	Need     layout.Slice // the receiver's local slice
	Region   layout.Slice // global coordinates, inside both
}

// Moves yields every move of the plan: by group, by tensor, by region.
func (p *Plan) Moves() iter.Seq[Move] {
	return func(yield func(Move) bool) {
		for gi := range p.Groups {
			g := &p.Groups[gi]
			for j, t := range g.Tensors {
				for _, r := range g.Regions {
					h := r.Holders[0]
					if r.choice >= 0 {
						h = r.Holders[g.choices[j][r.choice]]
					}
					if !yield(Move{Tensor: t, Sender: h.Sender, Receiver: r.Receiver, Held: h.Held, Need: r.Need, Region: r.Region}) {
						return
					}
				}
			}
		}
	}
}

// NumMoves returns the number of moves Moves yields.
func (p *Plan) NumMoves() int64 {
	var n int64
	for _, g := range p.Groups {
		n += int64(len(g.Tensors)) * int64(len(g.Regions))
	}
	return n
}

// Digest returns the SHA-256 of the plan's canonical encoding: ranks that
// hold plans with equal digests hold the same plan.
func (p *Plan) Digest() [32]byte { return p.digest }

// Make plans how senders' slices reach receivers' needs over links. Every
// element each receiver needs is planned exactly once, from one sender that
// holds it; a needed region no sender holds is an error that names the
// tensor and the region.
func Make(senders, receivers layout.Source, links Links) (*Plan, error) {
	if err := links.Validate(); err != nil {
		return nil, err
	}
	st, rt := senders.Tensors(), receivers.Tensors()
	byName := make(map[string]int, len(st))
	for i, t := range st {
		byName[t.Name] = i
	}
	p := &Plan{Senders: senders.NumRanks(), Receivers: receivers.NumRanks(), Tensors: rt, Links: links}
	fpS, fpR := newFingerprint(), newFingerprint()
	type key struct {
		hs, hr [2]uint64
	}
	groupOf := map[key]int{}
	for i, t := range rt {
		hr, needed := pieceHash(receivers, i, t, p.Receivers)
		si, held := byName[t.Name]
		hs := [2]uint64{}
		if held {
			s := st[si]
			if s.DType != t.DType || !slices.Equal(s.Shape, t.Shape) {
				return nil, fmt.Errorf("tensor %s: the senders hold it as %v %v, the receivers need %v %v", t.Name, s.DType, s.Shape, t.DType, t.Shape)
			}
			hs, _ = pieceHash(senders, si, t, p.Senders)
		}
		fpR.tensor(t, hr)
		fpS.tensor(t, hs)
		if !needed || t.Elements() == 0 {
			continue
		}
		if !held {
			r, s := firstPiece(receivers, i)
			return nil, fmt.Errorf("tensor %s: receiver %d needs %v, which no sender holds (the senders have no tensor of that name)", t.Name, r, s)
		}
		k := key{hs, hr}
		g, ok := groupOf[k]
		if !ok {
			regions, err := pattern(senders, si, receivers, i, t)
			if err != nil {
				return nil, err
			}
			g = len(p.Groups)
			groupOf[k] = g
			p.Groups = append(p.Groups, Group{Regions: regions})
		}
		p.Groups[g].Tensors = append(p.Groups[g].Tensors, i)
	}
	p.senderFP, p.receiverFP = fpS.sum(senders.NumRanks()), fpR.sum(receivers.NumRanks())
	p.balance()
	p.digest = p.encode()
	return p, nil
}

// firstPiece returns some rank's need of tensor t, for an error.
func firstPiece(src layout.Source, t int) (int, layout.Slice) {
	for r, s := range src.Pieces(t) {
		return r, s.Clone()
	}
	return -1, layout.Slice{}
}

type rankSlice struct {
	rank  int
	slice layout.Slice
}

// pattern computes the regions of one tensor: for each distinct need slice,
// the holders' slices cut it into regions, each with the senders that hold
// all of it.
func pattern(senders layout.Source, si int, receivers layout.Source, ri int, t layout.Tensor) ([]Region, error) {
	var holders []rankSlice
	for r, s := range senders.Pieces(si) {
		if !s.Empty() {
			holders = append(holders, rankSlice{r, s.Clone()})
		}
	}
	cuts := map[string][]cell{}
	var regions []Region
	for r, need := range receivers.Pieces(ri) {
		if need.Empty() {
			continue
		}
		k := need.String()
		cs, ok := cuts[k]
		if !ok {
			var err error
			if cs, err = cover(t, need, holders); err != nil {
				return nil, fmt.Errorf("receiver %d: %w", r, err)
			}
			cuts[k] = cs
		}
		n := need.Clone()
		for _, c := range cs {
			regions = append(regions, Region{Receiver: r, Need: n, Region: c.region, Holders: c.holders, choice: -1})
		}
	}
	return regions, nil
}

type cell struct {
	region  layout.Slice
	holders []Holder
}

// cover cuts need into regions by the holders' slices. When the holders
// that meet need do so without overlapping, each intersection is one region
// with one holder; otherwise the cut points of every slice in every
// dimension make a grid, and each grid cell is a region held by the holders
// that contain it.
func cover(t layout.Tensor, need layout.Slice, holders []rankSlice) ([]cell, error) {
	var meet []cell
	var total int64
	for _, h := range holders {
		if r, ok := h.slice.Intersect(need); ok {
			meet = append(meet, cell{r, []Holder{{h.rank, h.slice}}})
			total += r.Elements()
		}
	}
	if len(meet) == 0 {
		return nil, fmt.Errorf("tensor %s: region %v of the needed %v has no holder", t.Name, need, need)
	}
	if disjoint(meet) && total == need.Elements() {
		return meet, nil
	}
	// The grid.
	dims := len(need.Size)
	points := make([][]int64, dims)
	for d := range dims {
		ps := []int64{need.Offset[d], need.Offset[d] + need.Size[d]}
		for _, m := range meet {
			ps = append(ps, m.region.Offset[d], m.region.Offset[d]+m.region.Size[d])
		}
		slices.Sort(ps)
		points[d] = slices.Compact(ps)
	}
	var out []cell
	idx := make([]int, dims)
	for {
		c := layout.Slice{Offset: make([]int64, dims), Size: make([]int64, dims)}
		for d := range dims {
			c.Offset[d] = points[d][idx[d]]
			c.Size[d] = points[d][idx[d]+1] - points[d][idx[d]]
		}
		var hs []Holder
		for _, m := range meet {
			if m.region.Contains(c) {
				hs = append(hs, m.holders[0])
			}
		}
		if len(hs) == 0 {
			return nil, fmt.Errorf("tensor %s: region %v of the needed %v has no holder", t.Name, c, need)
		}
		out = append(out, cell{c, hs})
		d := dims - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < len(points[d])-1 {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			break
		}
	}
	return out, nil
}

// disjoint reports whether no two cells share an element.
func disjoint(cs []cell) bool {
	if len(cs) < 2 || len(cs[0].region.Size) == 0 {
		return len(cs) < 2
	}
	order := make([]int, len(cs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(cs[a].region.Offset[0], cs[b].region.Offset[0]) })
	sorted := true
	for i := 1; i < len(order); i++ {
		a, b := cs[order[i-1]].region, cs[order[i]].region
		if a.Offset[0]+a.Size[0] > b.Offset[0] {
			sorted = false
			break
		}
	}
	if sorted {
		return true
	}
	for i := range cs {
		for j := i + 1; j < len(cs); j++ {
			if overlap(cs[i].region, cs[j].region) {
				return false
			}
		}
	}
	return true
}

func overlap(a, b layout.Slice) bool {
	for d := range a.Size {
		if max(a.Offset[d], b.Offset[d]) >= min(a.Offset[d]+a.Size[d], b.Offset[d]+b.Size[d]) {
			return false
		}
	}
	return true
}
