package plan

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/layout"
)

func smallModel() ([]layout.Tensor, layout.Model) {
	bf := dtype.BF16
	ts := []layout.Tensor{
		{Name: "model.embed_tokens.weight", DType: bf, Shape: []int64{70, 6}},
		{Name: "model.layers.0.self_attn.q_proj.weight", DType: bf, Shape: []int64{8, 6}},
		{Name: "model.layers.0.self_attn.k_proj.weight", DType: bf, Shape: []int64{4, 6}},
		{Name: "model.layers.0.self_attn.o_proj.weight", DType: bf, Shape: []int64{6, 8}},
		{Name: "model.layers.0.input_layernorm.weight", DType: bf, Shape: []int64{6}},
		{Name: "model.layers.0.mlp.gate.weight", DType: bf, Shape: []int64{4, 6}},
	}
	for e := range 4 {
		ts = append(ts,
			layout.Tensor{Name: fmt.Sprintf("model.layers.0.mlp.experts.%d.gate_proj.weight", e), DType: bf, Shape: []int64{4, 6}},
			layout.Tensor{Name: fmt.Sprintf("model.layers.0.mlp.experts.%d.down_proj.weight", e), DType: bf, Shape: []int64{6, 4}})
	}
	ts = append(ts, layout.Tensor{Name: "lm_head.weight", DType: bf, Shape: []int64{70, 6}})
	return ts, layout.Model{Heads: 4, KVHeads: 2, Experts: 4}
}

// overlapping returns an explicit sender layout where each tensor's rows
// are covered by random, overlapping row ranges on random ranks, some
// ranks holding the whole tensor.
func overlapping(t *testing.T, rng *rand.Rand, ts []layout.Tensor, ranks int) *layout.Layout {
	l := &layout.Layout{TensorList: ts, Ranks: make([][]layout.Piece, ranks)}
	for i, tn := range ts {
		rows := tn.Shape[0]
		var lo int64
		for lo < rows {
			hi := min(rows, lo+1+rng.Int64N(rows))
			s := layout.Full(tn.Shape)
			start := max(0, lo-rng.Int64N(2)) // overlap the previous range by a row, sometimes
			s.Offset[0], s.Size[0] = start, hi-start
			r := rng.IntN(ranks)
			l.Ranks[r] = append(l.Ranks[r], layout.Piece{Tensor: i, Slice: s})
			lo = hi
		}
		if rng.IntN(3) == 0 {
			r := rng.IntN(ranks)
			l.Ranks[r] = append(l.Ranks[r], layout.Piece{Tensor: i, Slice: layout.Full(tn.Shape)})
		}
	}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	return l
}

func randomSenders(t *testing.T, rng *rand.Rand, ts []layout.Tensor, m layout.Model) (layout.Source, string) {
	if rng.IntN(3) == 0 {
		n := 1 + rng.IntN(4)
		return overlapping(t, rng, ts, n), fmt.Sprintf("overlapping on %d", n)
	}
	tp := []int{1, 2}[rng.IntN(2)]
	f := 1 + rng.IntN(4)
	s := layout.Spec{Ranks: tp * f, TP: tp, FSDP: true}
	p, err := layout.NewParallel(ts, nil, m, s)
	if err != nil {
		t.Fatal(err)
	}
	return p, fmt.Sprintf("%+v", s)
}

func randomReceivers(t *testing.T, rng *rand.Rand, ts []layout.Tensor, m layout.Model) (layout.Source, string) {
	tp := []int{1, 2}[rng.IntN(2)]
	ep := []int{1, 2, 4}[rng.IntN(3)]
	if ep > 1 && ep < tp {
		ep = tp
	}
	g := max(tp, ep)
	s := layout.Spec{Ranks: g * (1 + rng.IntN(3)), TP: tp, EP: ep}
	p, err := layout.NewParallel(ts, nil, m, s)
	if err != nil {
		t.Fatal(err)
	}
	return p, fmt.Sprintf("%+v", s)
}

// value is element (global row-major index) i of tensor t.
func value(t, i int64) int64 { return t<<32 | i }

func globalIndex(shape []int64, s layout.Slice, local int64) int64 {
	// local row-major index in s → global row-major index.
	g := int64(0)
	coord := make([]int64, len(s.Size))
	for d := len(s.Size) - 1; d >= 0; d-- {
		coord[d] = local%s.Size[d] + s.Offset[d]
		local /= s.Size[d]
	}
	for d := range shape {
		g = g*shape[d] + coord[d]
	}
	return g
}

// TestCoverageBruteForce: on random FSDP/TP/overlapping sender layouts and
// random TP/EP receiver layouts, every element every receiver needs is
// written exactly once, with the right value, by the runs of the moves;
// nothing else is written; each move reads from a slice its sender holds.
func TestCoverageBruteForce(t *testing.T) {
	ts, m := smallModel()
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 300 {
		snd, sdesc := randomSenders(t, rng, ts, m)
		rcv, rdesc := randomReceivers(t, rng, ts, m)
		links := Links{GPUsPerNode: 1 + rng.IntN(4), NIC: 1e9, NVLink: 8e9, Colocated: rng.IntN(4) == 0}
		p, err := Make(snd, rcv, links)
		if err != nil {
			t.Fatalf("trial %d (%s → %s): %v", trial, sdesc, rdesc, err)
		}
		// Receivers' buffers: per (receiver, tensor, need) the count of
		// writes per element and the value written.
		type key struct {
			r, t int
			need string
		}
		bufs := map[key][]int64{}
		writes := map[key][]int{}
		for ti := range ts {
			for r, s := range rcv.Pieces(ti) {
				k := key{r, ti, s.String()}
				bufs[k] = make([]int64, s.Elements())
				writes[k] = make([]int, s.Elements())
			}
		}
		held := map[string]bool{}
		for ti := range ts {
			for r, s := range snd.Pieces(ti) {
				held[fmt.Sprint(r, ti, s)] = true
			}
		}
		for mv := range p.Moves() {
			if !held[fmt.Sprint(mv.Sender, mv.Tensor, mv.Held)] {
				t.Fatalf("trial %d: sender %d does not hold %v of tensor %d", trial, mv.Sender, mv.Held, mv.Tensor)
			}
			if !mv.Held.Contains(mv.Region) || !mv.Need.Contains(mv.Region) {
				t.Fatalf("trial %d: region %v outside held %v or need %v", trial, mv.Region, mv.Held, mv.Need)
			}
			k := key{mv.Receiver, mv.Tensor, mv.Need.String()}
			buf, ok := bufs[k]
			if !ok {
				t.Fatalf("trial %d: a move to receiver %d of tensor %d %v it does not need", trial, mv.Receiver, mv.Tensor, mv.Need)
			}
			shape := ts[mv.Tensor].Shape
			for run := range mv.Runs(1) {
				for i := range run.Len {
					g := globalIndex(shape, mv.Held, run.Src+i)
					if want := globalIndex(shape, mv.Need, run.Dst+i); want != g {
						t.Fatalf("trial %d: run %+v of %+v maps element %d to %d", trial, run, mv, g, want)
					}
					buf[run.Dst+i] = value(int64(mv.Tensor), g)
					writes[k][run.Dst+i]++
				}
			}
		}
		for k, w := range writes {
			for i, n := range w {
				if n != 1 {
					t.Fatalf("trial %d (%s → %s): receiver %d tensor %s need %s element %d written %d times", trial, sdesc, rdesc, k.r, ts[k.t].Name, k.need, i, n)
				}
			}
		}
		if p.Stats.PredictedSeconds+1e-12 < p.Stats.BoundSeconds {
			t.Fatalf("trial %d: predicted %g below the bound %g", trial, p.Stats.PredictedSeconds, p.Stats.BoundSeconds)
		}
		var sum int64
		for _, b := range p.Stats.Sent {
			sum += b
		}
		if sum != p.Stats.Bytes {
			t.Fatalf("trial %d: senders send %d bytes, receivers take %d", trial, sum, p.Stats.Bytes)
		}
	}
}

func TestRunsContiguous(t *testing.T) {
	// Rows 2..4 of columns 4..8 of an [8, 8] tensor, from a sender holding
	// rows 0..4 whole to a receiver needing columns 4..8 of every row.
	mv := Move{
		Held:   layout.Slice{Offset: []int64{0, 0}, Size: []int64{4, 8}},
		Need:   layout.Slice{Offset: []int64{0, 4}, Size: []int64{8, 4}},
		Region: layout.Slice{Offset: []int64{2, 4}, Size: []int64{2, 4}},
	}
	var got []Run
	for r := range mv.Runs(2) {
		got = append(got, r)
	}
	want := []Run{{Src: 2 * (2*8 + 4), Dst: 2 * (2 * 4), Len: 8}, {Src: 2 * (3*8 + 4), Dst: 2 * (3 * 4), Len: 8}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("runs %v, want %v", got, want)
	}
	// Whole rows on both sides: one run.
	mv = Move{Held: layout.Full([]int64{8, 8}), Need: layout.Slice{Offset: []int64{4, 0}, Size: []int64{4, 8}}, Region: layout.Slice{Offset: []int64{4, 0}, Size: []int64{4, 8}}}
	got = nil
	for r := range mv.Runs(2) {
		got = append(got, r)
	}
	if len(got) != 1 || got[0] != (Run{Src: 64, Dst: 0, Len: 64}) {
		t.Errorf("one run expected: %v", got)
	}
}

func TestUncoveredNamed(t *testing.T) {
	ts := []layout.Tensor{{Name: "w", DType: dtype.F32, Shape: []int64{8, 4}}}
	snd := &layout.Layout{TensorList: ts, Ranks: [][]layout.Piece{
		{{Tensor: 0, Slice: layout.Slice{Offset: []int64{0, 0}, Size: []int64{3, 4}}}},
		{{Tensor: 0, Slice: layout.Slice{Offset: []int64{5, 0}, Size: []int64{3, 4}}}},
	}}
	rcv := &layout.Layout{TensorList: ts, Ranks: [][]layout.Piece{{{Tensor: 0, Slice: layout.Full([]int64{8, 4})}}}}
	if err := snd.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := rcv.Validate(); err != nil {
		t.Fatal(err)
	}
	_, err := Make(snd, rcv, Links{NIC: 1})
	if err == nil || !strings.Contains(err.Error(), "tensor w: region [3:5, 0:4]") {
		t.Errorf("got %v", err)
	}
	// A tensor the senders do not have at all.
	rcv2 := &layout.Layout{TensorList: []layout.Tensor{{Name: "v", DType: dtype.F32, Shape: []int64{2}}}, Ranks: [][]layout.Piece{{{Tensor: 0, Slice: layout.Full([]int64{2})}}}}
	rcv2.Validate()
	if _, err := Make(snd, rcv2, Links{NIC: 1}); err == nil || !strings.Contains(err.Error(), "tensor v") {
		t.Errorf("got %v", err)
	}
	if _, err := Make(snd, rcv, Links{}); err == nil {
		t.Error("zero NIC speed accepted")
	}
}
