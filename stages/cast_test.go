package stages

import (
	"bytes"
	"context"
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/wire"
)

// convert16 converts each element of src (of dtype from) to to, element by
// element through package cast's scalar functions.
func convert16(t testing.TB, src []byte, from, to dtype.DType) []byte {
	var out []byte
	switch {
	case from == dtype.F32 && to == dtype.BF16:
		for i := 0; i < len(src); i += 4 {
			out = binary.LittleEndian.AppendUint16(out, cast.F32ToBF16(binary.LittleEndian.Uint32(src[i:])))
		}
	case from == dtype.F32 && to == dtype.F16:
		for i := 0; i < len(src); i += 4 {
			out = binary.LittleEndian.AppendUint16(out, cast.F32ToF16(binary.LittleEndian.Uint32(src[i:])))
		}
	case from == dtype.F16 && to == dtype.BF16:
		for i := 0; i < len(src); i += 2 {
			out = binary.LittleEndian.AppendUint16(out, cast.F16ToBF16(binary.LittleEndian.Uint16(src[i:])))
		}
	case from == dtype.BF16 && to == dtype.F16:
		for i := 0; i < len(src); i += 2 {
			out = binary.LittleEndian.AppendUint16(out, cast.BF16ToF16(binary.LittleEndian.Uint16(src[i:])))
		}
	default:
		t.Fatalf("no reference conversion %s→%s", from, to)
	}
	if out == nil {
		out = []byte{}
	}
	return out
}

func TestCastInMemory(t *testing.T) {
	f32 := make([]byte, 4*1000)
	bf16 := make([]byte, 2*999)
	for i := range f32 {
		f32[i] = byte(i*37 + i>>3)
	}
	for i := range bf16 {
		bf16[i] = byte(i * 11)
	}
	src := tensorList{
		{Name: "a", DType: dtype.F32, Shape: []int64{10, 100}, Data: f32},
		{Name: "b", DType: dtype.BF16, Shape: []int64{999}, Data: bf16},
		{Name: "c", DType: dtype.I64, Shape: []int64{2}, Data: make([]byte, 16)},
	}
	g := newGroup(t, groupOpts{world: 2, bucket: 1 << 10, checksum: true})
	h := newMemModel()
	if err := g.round(context.Background(), Cast(src, dtype.F16), 1, []Sink{h}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		want []byte
		typ  dtype.DType
	}{
		{"a", convert16(t, f32, dtype.F32, dtype.F16), dtype.F16},
		{"b", convert16(t, bf16, dtype.BF16, dtype.F16), dtype.F16},
		{"c", make([]byte, 16), dtype.I64},
	} {
		got, ok := h.Get(c.name)
		if !ok || got.DType != c.typ || !bytes.Equal(got.Data, c.want) {
			t.Fatalf("tensor %s: got %v", c.name, got)
		}
	}
	// The cast source finds tensors as it emits them.
	l := Cast(listLookup{src}, dtype.BF16).(Lookuper)
	if a, ok := l.Lookup("a"); !ok || a.DType != dtype.BF16 || !slices.Equal(a.Shape, []int64{10, 100}) {
		t.Fatalf("lookup a: %+v", a)
	}
	if c, ok := l.Lookup("c"); !ok || c != src[2] {
		t.Fatalf("lookup c: %+v", c)
	}
	if _, ok := l.Lookup("zz"); ok {
		t.Fatal("found a tensor that does not exist")
	}
}

// listLookup adds Lookup to a list of tensors.
type listLookup struct{ list tensorList }

func (l listLookup) Tensors(ctx context.Context, emit func(*Tensor) error) error {
	return l.list.Tensors(ctx, emit)
}

func (l listLookup) Lookup(name string) (*Tensor, bool) {
	for _, t := range l.list {
		if t.Name == name {
			return t, true
		}
	}
	return nil, false
}

func TestCastReaderBounds(t *testing.T) {
	src := &Tensor{Name: "w", DType: dtype.F32, Shape: []int64{8}, Data: make([]byte, 32)}
	ct, err := (&castSource{to: dtype.BF16}).wrap(src)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := ct.Size(); n != 16 || ct.DType != dtype.BF16 {
		t.Fatalf("cast tensor %s of %d bytes", ct.DType, n)
	}
	p := make([]byte, 16)
	if err := ct.ReadAt(p[:6], 2); err != nil {
		t.Fatalf("element-aligned read: %v", err)
	}
	for _, c := range []struct{ n, off int64 }{{3, 0}, {4, 1}, {4, 14}, {2, -2}} {
		if err := ct.ReadAt(p[:c.n], c.off); err == nil || !strings.Contains(err.Error(), `"w"`) {
			t.Fatalf("read of %d bytes at %d: %v", c.n, c.off, err)
		}
	}
	// A source whose Data does not fit its shape is refused up front.
	bad := tensorList{{Name: "bad", DType: dtype.F32, Shape: []int64{8}, Data: make([]byte, 30)}}
	err = Cast(bad, dtype.BF16).Tensors(context.Background(), func(*Tensor) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("bad source: %v", err)
	}
}

func TestCastNoOp(t *testing.T) {
	src := tensorList{{Name: "a", DType: dtype.F32, Shape: []int64{1}, Data: make([]byte, 4)}}
	if s, ok := Cast(src, dtype.Invalid).(tensorList); !ok || &s[0] != &src[0] {
		t.Fatalf("Cast to Invalid did not return its source")
	}
	var got []*Tensor
	if err := Cast(src, dtype.F32).Tensors(context.Background(), func(t *Tensor) error { got = append(got, t); return nil }); err != nil || got[0] != src[0] {
		t.Fatalf("cast to the same dtype: %v %v", got, err)
	}
	err := Cast(src, dtype.I32).Tensors(context.Background(), func(*Tensor) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "I32") {
		t.Fatalf("cast to I32: %v", err)
	}
	if info := Cast(src, dtype.BF16).(Describer).SourceInfo(); info != nil {
		t.Fatalf("a list of tensors described as %+v", info)
	}
	if _, ok := Cast(src, dtype.BF16).(Lookuper).Lookup("a"); ok {
		t.Fatal("found a tensor in a source that cannot look up")
	}
}

// TestCastSourceInfo checks that Cast announces the cast dtype for the
// tensors it casts, and leaves its source's description alone.
func TestCastSourceInfo(t *testing.T) {
	info := &wire.SourceInfo{Format: "safetensors", Shards: []wire.ShardInfo{
		{File: "a", Tensors: []string{"w", "i"}, DTypes: []dtype.DType{dtype.F32, dtype.I64}, Shapes: [][]int64{{2}, {2}}},
		{File: "b", Tensors: []string{"h"}, DTypes: []dtype.DType{dtype.BF16}, Shapes: [][]int64{{4}}},
	}}
	got := castInfo(info, dtype.BF16)
	if !slices.Equal(got.Shards[0].DTypes, []dtype.DType{dtype.BF16, dtype.I64}) || !slices.Equal(got.Shards[1].DTypes, []dtype.DType{dtype.BF16}) {
		t.Fatalf("cast to BF16 announces %v %v", got.Shards[0].DTypes, got.Shards[1].DTypes)
	}
	if info.Shards[0].DTypes[0] != dtype.F32 {
		t.Fatal("castInfo modified its source's description")
	}
	if got := castInfo(info, dtype.F32); !slices.Equal(got.Shards[1].DTypes, []dtype.DType{dtype.F32}) || !slices.Equal(got.Shards[0].DTypes, info.Shards[0].DTypes) {
		t.Fatalf("cast to F32 announces %v %v", got.Shards[0].DTypes, got.Shards[1].DTypes)
	}
	noFloats := &wire.SourceInfo{Shards: []wire.ShardInfo{{File: "a", Tensors: []string{"i"}, DTypes: []dtype.DType{dtype.I64}, Shapes: [][]int64{{2}}}}}
	if castInfo(noFloats, dtype.BF16) != noFloats {
		t.Fatal("castInfo copied a description it does not change")
	}
}
