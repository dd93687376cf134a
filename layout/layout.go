package layout

import (
	"errors"
	"fmt"
	"iter"
	"strings"

	"github.com/weightcast/weightcast/dtype"
)

// Tensor is a global tensor: its name, dtype and global shape.
type Tensor struct {
	Name  string
	DType dtype.DType
	Shape []int64
}

// Elements returns the number of elements of the global tensor.
func (t Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Bytes returns the global tensor's size in bytes.
func (t Tensor) Bytes() int64 { return t.Elements() * int64(t.DType.Size()) }

// Validate reports a tensor with no name, an invalid dtype or a negative
// dimension.
func (t Tensor) Validate() error {
	switch {
	case t.Name == "":
		return errors.New("a tensor has no name")
	case !t.DType.Valid():
		return fmt.Errorf("tensor %s: invalid dtype", t.Name)
	}
	for i, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("tensor %s: dimension %d is %d", t.Name, i, d)
		}
	}
	return nil
}

// Slice is a rectangular region of a tensor: Offset[i] and Size[i] per
// dimension i. The two have the tensor's rank (a scalar has none).
type Slice struct {
	Offset []int64
	Size   []int64
}

// Full returns the slice that covers a whole tensor of the given shape.
func Full(shape []int64) Slice {
	return Slice{Offset: make([]int64, len(shape)), Size: append([]int64(nil), shape...)}
}

// Elements returns the number of elements in the slice.
func (s Slice) Elements() int64 {
	n := int64(1)
	for _, d := range s.Size {
		n *= d
	}
	return n
}

// Empty reports whether the slice holds no element.
func (s Slice) Empty() bool { return s.Elements() == 0 }

// Clone returns a copy that shares no memory with s.
func (s Slice) Clone() Slice {
	return Slice{Offset: append([]int64(nil), s.Offset...), Size: append([]int64(nil), s.Size...)}
}

// Equal reports whether two slices are the same region.
func (s Slice) Equal(o Slice) bool {
	if len(s.Size) != len(o.Size) {
		return false
	}
	for i := range s.Size {
		if s.Offset[i] != o.Offset[i] || s.Size[i] != o.Size[i] {
			return false
		}
	}
	return true
}

// Contains reports whether o lies inside s.
func (s Slice) Contains(o Slice) bool {
	for i := range s.Size {
		if o.Offset[i] < s.Offset[i] || o.Offset[i]+o.Size[i] > s.Offset[i]+s.Size[i] {
			return false
		}
	}
	return true
}

// Intersect returns the region s and o share, and false when they share no
// element.
func (s Slice) Intersect(o Slice) (Slice, bool) {
	r := Slice{Offset: make([]int64, len(s.Size)), Size: make([]int64, len(s.Size))}
	for i := range s.Size {
		lo := max(s.Offset[i], o.Offset[i])
		hi := min(s.Offset[i]+s.Size[i], o.Offset[i]+o.Size[i])
		if hi <= lo {
			return Slice{}, false
		}
		r.Offset[i], r.Size[i] = lo, hi-lo
	}
	return r, true
}

// String writes the slice as Python-style ranges, "[0:4, 8:16]".
func (s Slice) String() string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range s.Size {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d:%d", s.Offset[i], s.Offset[i]+s.Size[i])
	}
	b.WriteByte(']')
	return b.String()
}

// within reports an error when s is not a region of t.
func (s Slice) within(t Tensor) error {
	if len(s.Offset) != len(t.Shape) || len(s.Size) != len(t.Shape) {
		return fmt.Errorf("tensor %s: slice %v has %d dimensions, the tensor %d", t.Name, s, len(s.Size), len(t.Shape))
	}
	for i, d := range t.Shape {
		if s.Offset[i] < 0 || s.Size[i] < 0 || s.Offset[i]+s.Size[i] > d {
			return fmt.Errorf("tensor %s: slice %v is outside its shape %v", t.Name, s, t.Shape)
		}
	}
	return nil
}

// Source is a group of ranks (the senders, or the receivers) and the slices
// each holds or needs. A Source's answers do not change while a plan is made
// from it.
type Source interface {
	// NumRanks returns the number of ranks of the group.
	NumRanks() int
	// Tensors returns the global tensors the group's slices are of.
	Tensors() []Tensor
	// Pieces yields, for tensor index t, each rank that holds (or needs) a
	// slice of it and that slice, in rank order, several per rank allowed.
	// The yielded Slice may be reused after yield returns: clone it to keep
	// it.
	Pieces(t int) iter.Seq2[int, Slice]
}

// Piece is one slice of one tensor, the tensor named by its index in a
// Layout's Tensors.
type Piece struct {
	Tensor int
	Slice  Slice
}

// Layout is an explicit Source: Ranks[r] lists rank r's pieces.
type Layout struct {
	TensorList []Tensor
	Ranks      [][]Piece

	byTensor [][]rankPiece // built by Validate
}

type rankPiece struct {
	rank  int
	slice Slice
}

// NumRanks returns len(l.Ranks).
func (l *Layout) NumRanks() int { return len(l.Ranks) }

// Tensors returns l.TensorList.
func (l *Layout) Tensors() []Tensor { return l.TensorList }

// Pieces yields the pieces of tensor t by rank. It panics unless Validate
// succeeded first.
func (l *Layout) Pieces(t int) iter.Seq2[int, Slice] {
	if l.byTensor == nil {
		panic("layout: Layout.Pieces before Validate")
	}
	return func(yield func(int, Slice) bool) {
		for _, p := range l.byTensor[t] {
			if !yield(p.rank, p.slice) {
				return
			}
		}
	}
}

// Validate checks that tensor names are unique and every piece names a
// tensor and lies inside it, and indexes the pieces by tensor. Call it
// after changing l and before using l as a Source.
func (l *Layout) Validate() error {
	seen := make(map[string]bool, len(l.TensorList))
	for _, t := range l.TensorList {
		if err := t.Validate(); err != nil {
			return err
		}
		if seen[t.Name] {
			return fmt.Errorf("tensor %s is listed twice", t.Name)
		}
		seen[t.Name] = true
	}
	by := make([][]rankPiece, len(l.TensorList))
	for r, ps := range l.Ranks {
		for _, p := range ps {
			if p.Tensor < 0 || p.Tensor >= len(l.TensorList) {
				return fmt.Errorf("rank %d: piece of tensor index %d, of %d tensors", r, p.Tensor, len(l.TensorList))
			}
			if err := p.Slice.within(l.TensorList[p.Tensor]); err != nil {
				return fmt.Errorf("rank %d: %w", r, err)
			}
			if p.Slice.Empty() {
				continue
			}
			by[p.Tensor] = append(by[p.Tensor], rankPiece{r, p.Slice})
		}
	}
	l.byTensor = by
	return nil
}

// ChunkDim0 returns the part of s that FSDP rank i of n holds when s is
// split along dim 0 the way torch.chunk splits it (ceil(rows/n) rows per
// rank, the last ranks shorter or empty), and false when that part is empty.
// A scalar (no dimension) is held whole by rank 0.
func ChunkDim0(s Slice, i, n int) (Slice, bool) {
	if len(s.Size) == 0 {
		return s, i == 0
	}
	rows := s.Size[0]
	chunk := (rows + int64(n) - 1) / int64(n)
	lo := min(int64(i)*chunk, rows)
	hi := min(lo+chunk, rows)
	if hi <= lo {
		return Slice{}, false
	}
	c := s.Clone()
	c.Offset[0] += lo
	c.Size[0] = hi - lo
	return c, true
}
