package layout

import (
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
)

func TestSlice(t *testing.T) {
	a := Slice{Offset: []int64{0, 4}, Size: []int64{8, 4}}
	b := Slice{Offset: []int64{6, 0}, Size: []int64{4, 6}}
	got, ok := a.Intersect(b)
	if !ok || got.String() != "[6:8, 4:6]" {
		t.Fatalf("Intersect = %v %v", got, ok)
	}
	if _, ok := a.Intersect(Slice{Offset: []int64{8, 0}, Size: []int64{1, 8}}); ok {
		t.Error("disjoint slices intersect")
	}
	if !a.Contains(got) || got.Contains(a) {
		t.Error("Contains")
	}
	if a.Elements() != 32 || !(Slice{Offset: []int64{0}, Size: []int64{0}}).Empty() {
		t.Error("Elements/Empty")
	}
}

func TestChunkDim0(t *testing.T) {
	// 10 rows over 4 ranks: torch.chunk gives 3, 3, 3, 1.
	s := Full([]int64{10, 2})
	var got []string
	for i := range 4 {
		c, ok := ChunkDim0(s, i, 4)
		if ok {
			got = append(got, c.String())
		}
	}
	if strings.Join(got, " ") != "[0:3, 0:2] [3:6, 0:2] [6:9, 0:2] [9:10, 0:2]" {
		t.Errorf("chunks: %v", got)
	}
	// 2 rows over 4 ranks: the last two hold nothing.
	if _, ok := ChunkDim0(Full([]int64{2}), 2, 4); ok {
		t.Error("empty chunk reported")
	}
}

func TestLayoutValidate(t *testing.T) {
	ts := []Tensor{{Name: "w", DType: dtype.F32, Shape: []int64{4, 4}}}
	bad := []struct {
		l    Layout
		want string
	}{
		{Layout{TensorList: ts, Ranks: [][]Piece{{{Tensor: 1, Slice: Full([]int64{4, 4})}}}}, "tensor index 1"},
		{Layout{TensorList: ts, Ranks: [][]Piece{{{Tensor: 0, Slice: Slice{Offset: []int64{2, 0}, Size: []int64{4, 4}}}}}}, "outside its shape"},
		{Layout{TensorList: ts, Ranks: [][]Piece{{{Tensor: 0, Slice: Full([]int64{4})}}}}, "1 dimensions"},
		{Layout{TensorList: append(ts, ts[0])}, "listed twice"},
		{Layout{TensorList: []Tensor{{Name: "x", Shape: []int64{1}}}}, "invalid dtype"},
	}
	for _, b := range bad {
		if err := b.l.Validate(); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("got %v, want %q", err, b.want)
		}
	}
}

func TestParallelPieces(t *testing.T) {
	ts := []Tensor{
		{Name: "model.layers.0.mlp.down_proj.weight", DType: dtype.BF16, Shape: []int64{8, 16}},
		{Name: "model.norm.weight", DType: dtype.BF16, Shape: []int64{8}},
	}
	// 4 trainer ranks: TP 2 × FSDP 2.
	p, err := NewParallel(ts, nil, Model{}, Spec{Ranks: 4, TP: 2, FSDP: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for r, s := range p.Pieces(0) {
		got = append(got, string(rune('0'+r))+s.String())
	}
	// Rank i: TP rank i%2 (columns), FSDP chunk i/2 (rows).
	if w := "0[0:4, 0:8] 1[0:4, 8:16] 2[4:8, 0:8] 3[4:8, 8:16]"; strings.Join(got, " ") != w {
		t.Errorf("down_proj pieces %v, want %s", got, w)
	}
	if s, ok := p.Slice(1, 3); !ok || s.String() != "[4:8]" {
		t.Errorf("norm on rank 3: %v %v", s, ok)
	}
	if _, err := NewParallel(ts, nil, Model{}, Spec{Ranks: 6, TP: 4}); err == nil {
		t.Error("6 ranks at TP 4 accepted")
	}
	if _, err := NewParallel(ts, nil, Model{}, Spec{Ranks: 3, TP: 3}); err == nil || !strings.Contains(err.Error(), "down_proj") {
		t.Errorf("16 columns over 3: %v", err)
	}
	if err := (Spec{Ranks: 8, TP: 8, EP: 4}).Validate(); err == nil {
		t.Error("EP 4 under TP 8 accepted")
	}
	if err := (Spec{Ranks: 12, TP: 4, EP: 6}).Validate(); err == nil {
		t.Error("EP 6 over TP 4 accepted")
	}
	c, k := Spec{Ranks: 16, TP: 2, EP: 8}.Coord(13)
	if c != (Coord{TPRank: 1, TPSize: 2, EPRank: 5, EPSize: 8}) || k != 1 {
		t.Errorf("Coord(13) = %+v, %d", c, k)
	}
}
