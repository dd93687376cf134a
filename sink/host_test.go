package sink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// u8 is the entry of a whole U8 tensor of n bytes.
func u8(name string, n int64) *wire.Entry {
	return &wire.Entry{Name: name, DType: dtype.U8, Shape: []int64{n}, Size: n, Total: n}
}

func fill(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }

// shadowRound loads tensors (name → fill byte) into h as one round and
// commits it on the group when commit is set.
func shadowRound(t *testing.T, h *sink.HostModel, version uint64, tensors map[string]byte, commit bool) {
	t.Helper()
	ctx := context.Background()
	if err := h.Begin(ctx, version, nil); err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range tensors {
			if !yield(n) {
				return
			}
		}
	}) {
		if err := h.Load(ctx, u8(name, 64), fill(64, tensors[name])); err != nil {
			t.Fatal(err)
		}
	}
	if !commit {
		return
	}
	if err := h.Commit(ctx, version); err != nil {
		t.Fatal(err)
	}
	if err := h.Committed(ctx, version); err != nil {
		t.Fatal(err)
	}
}

// serves checks the bytes h serves: name → fill byte, and nothing else.
func serves(t *testing.T, h *sink.HostModel, version uint64, want map[string]byte) {
	t.Helper()
	v, snap := h.Snapshot()
	if v != version || h.Version() != version {
		t.Fatalf("serves version %d (Version %d), want %d", v, h.Version(), version)
	}
	if len(snap) != len(want) {
		t.Fatalf("serves %v, want %d tensors", h.Names(), len(want))
	}
	for name, b := range want {
		got, ok := h.Get(name)
		if !ok || !bytes.Equal(got.Data, fill(64, b)) {
			t.Fatalf("version %d: tensor %s is %v, want all %#x", version, name, got, b)
		}
	}
}

// TestShadowCopies drives a shadowed HostModel by hand: rounds that skip a
// tensor keep its committed bytes, a tensor that comes back does not
// overwrite the copy still served, a failed round leaves nothing behind,
// and a changed shape is reallocated.
func TestShadowCopies(t *testing.T) {
	h := sink.NewHostModel(sink.WithShadow())
	if h.Holding() != stages.HoldsShadowed || sink.NewHostModel().Holding() != stages.HoldsInPlace {
		t.Fatal("Holding")
	}
	shadowRound(t, h, 1, map[string]byte{"a": 1, "b": 1}, true)
	serves(t, h, 1, map[string]byte{"a": 1, "b": 1})

	// Round 2 carries only a: before the commit the model serves
	// version 1, after it a is new and b keeps version 1's bytes.
	shadowRound(t, h, 2, map[string]byte{"a": 2}, false)
	serves(t, h, 1, map[string]byte{"a": 1, "b": 1})
	ctx := context.Background()
	h.Commit(ctx, 2)
	if err := h.Committed(ctx, 3); err == nil {
		t.Fatal("a commit of another version than the one loaded was taken")
	}
	if err := h.Committed(ctx, 2); err != nil {
		t.Fatal(err)
	}
	serves(t, h, 2, map[string]byte{"a": 2, "b": 1})

	// Round 3 carries b again: the served b (shared by both copies since
	// round 2) must not change before the commit.
	oldB, _ := h.Get("b")
	shadowRound(t, h, 3, map[string]byte{"a": 3, "b": 3}, false)
	serves(t, h, 2, map[string]byte{"a": 2, "b": 1})
	h.Commit(ctx, 3)
	h.Committed(ctx, 3)
	serves(t, h, 3, map[string]byte{"a": 3, "b": 3})
	if !bytes.Equal(oldB.Data, fill(64, 1)) {
		t.Fatal("loading b into the spare copy wrote into the tensor served before")
	}

	// Round 4 fails after loading a and a new tensor c; round 5 carries
	// a only. c must not appear, a must be round 5's.
	shadowRound(t, h, 4, map[string]byte{"a": 4, "c": 4}, false)
	serves(t, h, 3, map[string]byte{"a": 3, "b": 3})
	shadowRound(t, h, 5, map[string]byte{"a": 5}, true)
	serves(t, h, 5, map[string]byte{"a": 5, "b": 3})

	// A changed shape is a new tensor.
	allocs := h.Allocations()
	if err := h.Begin(ctx, 6, nil); err != nil {
		t.Fatal(err)
	}
	e := &wire.Entry{Name: "a", DType: dtype.U8, Shape: []int64{2, 16}, Size: 32, Total: 32}
	if err := h.Load(ctx, e, fill(32, 6)); err != nil {
		t.Fatal(err)
	}
	h.Commit(ctx, 6)
	h.Committed(ctx, 6)
	if a, _ := h.Get("a"); !slices.Equal(a.Shape, []int64{2, 16}) || !bytes.Equal(a.Data, fill(32, 6)) || h.Allocations() != allocs+1 {
		t.Fatalf("reshaped a: %+v, %d allocations after %d", a, h.Allocations(), allocs)
	}
}

// corrupting flips a bit of the bytes that landed in one broadcast, once
// armed, as a link that corrupts them in transit would.
type corrupting struct {
	transport.Endpoint
	mu   sync.Mutex
	left int // broadcasts to let through before the one it corrupts; -1: none
}

// arm has the broadcast after the next n corrupted.
func (c *corrupting) arm(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.left = n
}

func (c *corrupting) Broadcast(ctx context.Context, seq uint64, buf mem.Buffer, n int) error {
	err := c.Endpoint.Broadcast(ctx, seq, buf, n)
	c.mu.Lock()
	hit := c.left == 0
	if c.left >= 0 {
		c.left--
	}
	c.mu.Unlock()
	if err == nil && hit && n > 0 {
		buf.Host()[n/2] ^= 0x10
	}
	return err
}

// TestShadowServesThroughRounds reads a shadowed model from another
// goroutine while rounds run: every snapshot is one whole committed
// version, byte for byte, the version advances at each commit, and a round
// that fails halfway changes nothing the reader sees. Run with -race, it
// also shows that no round writes into the copy being served, and steady
// rounds reuse the model's two copies.
func TestShadowServesThroughRounds(t *testing.T) {
	h := sink.NewHostModel(sink.WithShadow())
	fe := &corrupting{left: -1}
	g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 2, Bucket: 64 << 10, Checksum: true, WrapEndpoint: func(rank int, ep transport.Endpoint) transport.Endpoint {
		if rank != 1 {
			return ep
		}
		fe.Endpoint = ep
		return fe
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want := map[uint64]map[string][]byte{}
	expect := func(version uint64) {
		m := roundModel(t, version)
		want[version] = map[string][]byte{}
		for _, tn := range m.List() {
			b := make([]byte, mustSize(t, tn))
			if err := tn.ReadAt(b, 0); err != nil {
				t.Fatal(err)
			}
			want[version][tn.Name] = b
		}
	}
	const rounds = 6
	for v := uint64(1); v <= rounds+1; v++ {
		expect(v)
	}
	read := func(stop <-chan struct{}) (seen map[uint64]int, err error) {
		seen = map[uint64]int{}
		for {
			v, snap := h.Snapshot()
			seen[v]++
			if v > 0 {
				if len(snap) != len(want[v]) {
					return seen, errors.New("a snapshot with the wrong tensors")
				}
				for name, tn := range snap {
					if !bytes.Equal(tn.Data, want[v][name]) {
						return seen, fmt.Errorf("tensor %s is not version %d's", name, v)
					}
				}
			}
			select {
			case <-stop:
				return seen, nil
			default:
			}
		}
	}
	for v := uint64(1); v <= rounds+1; v++ {
		// The last round fails halfway: a bit flips in its third bucket.
		last := v == rounds+1
		stop := make(chan struct{})
		var seen map[uint64]int
		var readErr error
		var reader sync.WaitGroup
		reader.Go(func() { seen, readErr = read(stop) })
		errs := make([]error, 2)
		if last {
			fe.arm(2) // the round's third bucket
			errs = g.RoundClosingOnError(ctx, roundModel(t, v), v, []stages.Sink{h})
			if errs[0] == nil {
				t.Fatal("the root reported success")
			}
		} else {
			var wg sync.WaitGroup
			wg.Go(func() { _, errs[0] = g.Sender.Sync(ctx, roundModel(t, v), v) })
			wg.Go(func() { _, errs[1] = g.Receivers[0].Sync(ctx, h) })
			wg.Wait()
		}
		close(stop)
		reader.Wait()
		if readErr != nil {
			t.Fatalf("round %d: %v", v, readErr)
		}
		if last {
			if errs[1] == nil || !strings.Contains(errs[1].Error(), "checksum") {
				t.Fatalf("the last round: %v", errs)
			}
			if len(seen) != 1 || seen[rounds] == 0 || h.Version() != rounds || g.Receivers[0].State() != stages.StateIntact {
				t.Fatalf("during the failed round the reader saw versions %v; the model serves %d, state %v", seen, h.Version(), g.Receivers[0].State())
			}
			if err := servesModel(h, roundModel(t, rounds)); err != nil {
				t.Fatal(err)
			}
			// Steady rounds reuse both copies.
			if a, n := h.Allocations(), len(roundModel(t, 1).List()); a != 2*n {
				t.Fatalf("the shadowed model allocated %d tensors over %d rounds of %d; want %d (two copies)", a, rounds+1, n, 2*n)
			}
			break
		}
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		for sv := range seen {
			if sv != v && sv != v-1 {
				t.Fatalf("round %d: the reader saw version %d", v, sv)
			}
		}
		if err := servesModel(h, roundModel(t, v)); err != nil || h.Version() != v {
			t.Fatalf("after round %d: version %d, %v", v, h.Version(), err)
		}
	}
}

func mustSize(t *testing.T, tn *stages.Tensor) int64 {
	t.Helper()
	n, err := tn.Size()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// servesModel reports the first tensor of want whose bytes h does not
// serve.
func servesModel(h *sink.HostModel, want *source.SyntheticModel) error {
	for _, w := range want.List() {
		got, ok := h.Get(w.Name)
		if !ok {
			return fmt.Errorf("tensor %s missing", w.Name)
		}
		exp := make([]byte, len(got.Data))
		if err := w.ReadAt(exp, 0); err != nil {
			return err
		}
		if !bytes.Equal(got.Data, exp) {
			return fmt.Errorf("tensor %s differs", w.Name)
		}
	}
	return nil
}
