package plan

import (
	"fmt"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/layout"
)

// denseModel returns n layers of a small Llama-like model.
func denseModel(n int) []layout.Tensor {
	bf := dtype.BF16
	ts := []layout.Tensor{{Name: "model.embed_tokens.weight", DType: bf, Shape: []int64{512, 64}}}
	for l := range n {
		p := fmt.Sprintf("model.layers.%d.", l)
		ts = append(ts,
			layout.Tensor{Name: p + "self_attn.q_proj.weight", DType: bf, Shape: []int64{64, 64}},
			layout.Tensor{Name: p + "self_attn.k_proj.weight", DType: bf, Shape: []int64{16, 64}},
			layout.Tensor{Name: p + "self_attn.v_proj.weight", DType: bf, Shape: []int64{16, 64}},
			layout.Tensor{Name: p + "self_attn.o_proj.weight", DType: bf, Shape: []int64{64, 64}},
			layout.Tensor{Name: p + "mlp.gate_proj.weight", DType: bf, Shape: []int64{256, 64}},
			layout.Tensor{Name: p + "mlp.up_proj.weight", DType: bf, Shape: []int64{256, 64}},
			layout.Tensor{Name: p + "mlp.down_proj.weight", DType: bf, Shape: []int64{64, 256}},
			layout.Tensor{Name: p + "input_layernorm.weight", DType: bf, Shape: []int64{64}},
		)
	}
	return append(ts, layout.Tensor{Name: "lm_head.weight", DType: bf, Shape: []int64{512, 64}})
}

var denseHeads = layout.Model{Heads: 8, KVHeads: 2}

func parallel(t testing.TB, ts []layout.Tensor, s layout.Spec) *layout.Parallel {
	t.Helper()
	p, err := layout.NewParallel(ts, nil, denseHeads, s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBalanceReplicas: every sender holds the whole model, so every region
// has a choice; no sender sends more than the mean plus one region, and the
// plan is within 1.1× of its bound.
func TestBalanceReplicas(t *testing.T) {
	ts := denseModel(8)
	snd := parallel(t, ts, layout.Spec{Ranks: 6})
	rcv := parallel(t, ts, layout.Spec{Ranks: 8, TP: 4})
	p, err := Make(snd, rcv, Links{GPUsPerNode: 4, NIC: 50e9, NVLink: 450e9})
	if err != nil {
		t.Fatal(err)
	}
	var biggest int64
	for m := range p.Moves() {
		biggest = max(biggest, m.Region.Elements()*2)
	}
	st := p.Stats
	if float64(st.SentMax) > st.SentMean+float64(biggest) {
		t.Errorf("sent max %d > mean %.0f + biggest region %d", st.SentMax, st.SentMean, biggest)
	}
	if r := st.PredictedSeconds / st.BoundSeconds; r > 1.1 {
		t.Errorf("predicted %g s is %.3f× the bound %g s (%s)", st.PredictedSeconds, r, st.BoundSeconds, st.Bound)
	}
	// TP 4 receivers take a quarter of the non-replicated bytes each.
	full := int64(0)
	for _, tn := range ts {
		full += tn.Bytes()
	}
	if st.ReceivedMax >= full/2 {
		t.Errorf("a TP-4 receiver takes %d of %d bytes", st.ReceivedMax, full)
	}
}

// TestBalanceFSDPAtBound: with FSDP every byte has one holder, so the plan
// is forced and its time is its bound.
func TestBalanceFSDPAtBound(t *testing.T) {
	ts := denseModel(4)
	snd := parallel(t, ts, layout.Spec{Ranks: 8, FSDP: true})
	rcv := parallel(t, ts, layout.Spec{Ranks: 4, TP: 2})
	p, err := Make(snd, rcv, Links{GPUsPerNode: 8, NIC: 50e9, NVLink: 450e9})
	if err != nil {
		t.Fatal(err)
	}
	st := p.Stats
	if d := st.PredictedSeconds - st.BoundSeconds; d < -1e-15 || d > 1e-12 {
		t.Errorf("predicted %g, bound %g (%s)", st.PredictedSeconds, st.BoundSeconds, st.Bound)
	}
	// With a latency each stream adds it on the links it uses.
	p2, _ := Make(snd, rcv, Links{GPUsPerNode: 8, NIC: 50e9, NVLink: 450e9, Latency: 1e-3})
	if p2.Stats.PredictedSeconds <= st.PredictedSeconds {
		t.Errorf("latency did not add: %g vs %g", p2.Stats.PredictedSeconds, st.PredictedSeconds)
	}
}

// TestColocatedLocalBytes: receivers on the senders' GPUs take what their
// own GPU holds without a link.
func TestColocatedLocalBytes(t *testing.T) {
	ts := denseModel(2)
	snd := parallel(t, ts, layout.Spec{Ranks: 4})
	rcv := parallel(t, ts, layout.Spec{Ranks: 4})
	p, err := Make(snd, rcv, Links{GPUsPerNode: 4, NIC: 50e9, NVLink: 450e9, Colocated: true})
	if err != nil {
		t.Fatal(err)
	}
	for m := range p.Moves() {
		if m.Sender != m.Receiver {
			t.Fatalf("move from sender %d to receiver %d when the receiver's GPU holds it", m.Sender, m.Receiver)
		}
	}
	if p.Stats.PredictedSeconds != 0 || p.Stats.BoundSeconds != 0 {
		t.Errorf("local copies take %g s (bound %g)", p.Stats.PredictedSeconds, p.Stats.BoundSeconds)
	}
}

func TestDeterministicDigest(t *testing.T) {
	ts := denseModel(6)
	links := Links{GPUsPerNode: 4, NIC: 50e9, NVLink: 450e9}
	mk := func(tp int) *Plan {
		p, err := Make(parallel(t, ts, layout.Spec{Ranks: 4, TP: 2, FSDP: true}), parallel(t, ts, layout.Spec{Ranks: 8, TP: tp}), links)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := mk(4), mk(4)
	if a.Digest() != b.Digest() {
		t.Fatal("the same layouts gave different digests")
	}
	var ma, mb []Move
	for m := range a.Moves() {
		ma = append(ma, m)
	}
	for m := range b.Moves() {
		mb = append(mb, m)
	}
	if fmt.Sprint(ma) != fmt.Sprint(mb) {
		t.Fatal("the same layouts gave different moves")
	}
	if c := mk(2); c.Digest() == a.Digest() {
		t.Fatal("a different receiver layout gave the same digest")
	}
	// The digest of this plan is pinned: a change to the encoding or to
	// the planner's choices must be deliberate (update the constant).
	const pinned = "13dad63cb38c6fc77292f8e9d27112a9e31407a54d9cec6a457627dee82104e3"
	if got := fmt.Sprintf("%x", a.Digest()); got != pinned {
		t.Errorf("digest %s, pinned %s", got, pinned)
	}
	if int64(len(ma)) != a.NumMoves() {
		t.Errorf("NumMoves %d, Moves yields %d", a.NumMoves(), len(ma))
	}
}

func TestReplanOnLayoutChange(t *testing.T) {
	ts := denseModel(3)
	links := Links{GPUsPerNode: 4, NIC: 50e9, NVLink: 450e9}
	snd := parallel(t, ts, layout.Spec{Ranks: 4, FSDP: true})
	rcv := parallel(t, ts, layout.Spec{Ranks: 4, TP: 4})
	var c Cache
	p1, replanned, err := c.Get(snd, rcv, links)
	if err != nil || !replanned {
		t.Fatalf("first Get: %v %v", replanned, err)
	}
	if !p1.Current(snd, rcv) {
		t.Fatal("a plan is not current for its own layouts")
	}
	p2, replanned, _ := c.Get(parallel(t, ts, layout.Spec{Ranks: 4, FSDP: true}), rcv, links)
	if replanned || p2 != p1 {
		t.Fatal("equal layouts re-planned")
	}
	rcv2 := parallel(t, ts, layout.Spec{Ranks: 4, TP: 2})
	if p1.Current(snd, rcv2) {
		t.Fatal("a plan is current for a changed receiver layout")
	}
	p3, replanned, _ := c.Get(snd, rcv2, links)
	if !replanned || p3.Digest() == p1.Digest() {
		t.Fatal("a changed layout did not re-plan")
	}
	snd2 := parallel(t, ts, layout.Spec{Ranks: 4, TP: 2, FSDP: true})
	if _, replanned, _ := c.Get(snd2, rcv2, links); !replanned {
		t.Fatal("a changed sender layout did not re-plan")
	}
	if _, replanned, _ := c.Get(snd2, rcv2, Links{NIC: 1e9}); !replanned {
		t.Fatal("changed links did not re-plan")
	}
}
