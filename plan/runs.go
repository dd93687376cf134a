package plan

import (
	"iter"

	"github.com/weightcast/weightcast/layout"
)

// Run is one contiguous byte range of a move: Len bytes from offset Src of
// the sender's local tensor to offset Dst of the receiver's.
type Run struct {
	Src, Dst, Len int64
}

// Runs yields the move's bytes as contiguous runs, in row-major order of
// the region, for elements of elemSize bytes. A run spans the innermost
// dimensions that the region covers whole in both local tensors, and its
// part of the next one.
func (m Move) Runs(elemSize int) iter.Seq[Run] {
	return func(yield func(Run) bool) {
		n := len(m.Region.Size)
		es := int64(elemSize)
		if n == 0 {
			yield(Run{0, 0, es})
			return
		}
		if m.Region.Empty() {
			return
		}
		// k: the outermost dimension inside a run.
		k := n - 1
		run := m.Region.Size[k]
		for k > 0 && m.Region.Size[k] == m.Held.Size[k] && m.Region.Size[k] == m.Need.Size[k] {
			k--
			run *= m.Region.Size[k]
		}
		hs, ns := strides(m.Held), strides(m.Need)
		idx := make([]int64, k) // position in the region's dims 0..k-1
		for {
			var src, dst int64
			for d := range n {
				g := m.Region.Offset[d]
				if d < k {
					g += idx[d]
				}
				src += (g - m.Held.Offset[d]) * hs[d]
				dst += (g - m.Need.Offset[d]) * ns[d]
			}
			if !yield(Run{src * es, dst * es, run * es}) {
				return
			}
			d := k - 1
			for ; d >= 0; d-- {
				idx[d]++
				if idx[d] < m.Region.Size[d] {
					break
				}
				idx[d] = 0
			}
			if d < 0 {
				return
			}
		}
	}
}

// strides returns the row-major element strides of a local tensor of s's
// size.
func strides(s layout.Slice) []int64 {
	st := make([]int64, len(s.Size))
	x := int64(1)
	for d := len(s.Size) - 1; d >= 0; d-- {
		st[d] = x
		x *= s.Size[d]
	}
	return st
}
