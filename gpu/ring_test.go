package gpu

import (
	"context"
	"slices"
	"testing"

	"github.com/weightcast/weightcast/mem"
)

// testMirror returns a mirrorMem of size bytes of plain host memory on
// both sides, which needs no GPU; a freed side has length 0.
func testMirror(t *testing.T, size int) *mirrorMem {
	t.Helper()
	host, _ := mem.Host{}.Alloc(size)
	dev, _ := mem.Host{}.Alloc(size)
	return &mirrorMem{host: host, dev: dev}
}

func freed(m *mirrorMem) bool { return m.host.Len() == 0 && m.dev.Len() == 0 }

// TestDescSpares checks the spare list: at most the given number kept,
// nothing kept once the device is closed, take returns the last one kept
// only if it has the size asked for, free frees them all.
func TestDescSpares(t *testing.T) {
	var sp descSpares
	d := &CUDADevice{}
	a, b, c := testMirror(t, 64), testMirror(t, 128), testMirror(t, 64)
	if !sp.put(a, d, 2) || !sp.put(b, d, 2) {
		t.Fatal("put refused below the bound")
	}
	if sp.put(c, d, 2) {
		t.Fatal("put kept more than the bound")
	}
	if m := sp.take(64); m != nil {
		t.Fatal("take returned a spare of another size than the last one kept")
	}
	if m := sp.take(128); m != b {
		t.Fatalf("take(128) = %p, want %p", m, b)
	}
	if m := sp.take(64); m != a {
		t.Fatalf("take(64) = %p, want %p", m, a)
	}
	if m := sp.take(64); m != nil {
		t.Fatal("take returned a spare from an empty list")
	}
	sp.put(a, d, 2)
	sp.put(b, d, 2)
	if err := sp.free(); err != nil {
		t.Fatal(err)
	}
	if !freed(a) || !freed(b) || len(sp.mems) != 0 {
		t.Fatal("free left spares allocated or listed")
	}
	d.closed.Store(true)
	if sp.put(c, d, 2) {
		t.Fatal("put kept memory for a closed device")
	}
}

// TestDescRingClose checks where a ring's memory goes on close, with no
// launch queued (so no GPU): to the spares when the ring has its kind's
// slot size, and from there to the next ring's alloc; freed when it has
// another size or the spares are full. close is idempotent.
func TestDescRingClose(t *testing.T) {
	var sp descSpares
	kind := &descKind{name: "test", words: 2, slotDescs: 4, maxSpare: 1,
		spares: func(*CUDADevice) *descSpares { return &sp }}
	s := &Stream{d: &CUDADevice{}}
	ctx := context.Background()
	size := descSlots * 4 * 2 * 8

	r := kind.ring()
	m := testMirror(t, size)
	r.mem = m
	if err := r.close(ctx, s); err != nil {
		t.Fatal(err)
	}
	if r.mem != nil || freed(m) || len(sp.mems) != 1 {
		t.Fatal("the memory of a closed ring did not go to the spares")
	}
	if err := r.close(ctx, s); err != nil || len(sp.mems) != 1 {
		t.Fatalf("a second close: %v, %d spares", err, len(sp.mems))
	}

	next := kind.ring()
	if err := next.alloc(s); err != nil || next.mem != m || len(sp.mems) != 0 {
		t.Fatalf("alloc did not take the spare: %v", err)
	}
	if err := next.alloc(s); err != nil || next.mem != m {
		t.Fatalf("a second alloc replaced the memory: %v", err)
	}

	full := kind.ring()
	full.mem = testMirror(t, size)
	if err := full.close(ctx, s); err != nil || len(sp.mems) != 1 {
		t.Fatalf("close: %v, %d spares", err, len(sp.mems))
	}
	if err := next.close(ctx, s); err != nil || !freed(m) || len(sp.mems) != 1 {
		t.Fatalf("close with the spares full: %v; the memory should be freed", err)
	}

	other := kind.ring()
	other.slotDescs = 3
	o := testMirror(t, descSlots*3*2*8)
	other.mem = o
	sp.free()
	if err := other.close(ctx, s); err != nil || !freed(o) || len(sp.mems) != 0 {
		t.Fatalf("close of a ring of another slot size: %v; the memory should be freed", err)
	}
}

// checkSplitter has a new source from split hand out its descriptors,
// words words each, through slots of 1, 2, 7 and 1000 descriptors, and
// compares them with want. Each slot has room for all but one word of one
// more descriptor to spare, which fill must leave unused.
func checkSplitter(t *testing.T, words int, want [][]uint64, split func() descSource) {
	t.Helper()
	for _, slot := range []int{1, 2, 7, 1000} {
		sp := split()
		out := make([]uint64, slot*words+words-1)
		var got [][]uint64
		for !sp.done() {
			n := sp.fill(out)
			if n == 0 || n > slot {
				t.Fatalf("slot of %d: filled %d descriptors", slot, n)
			}
			for i := range n {
				got = append(got, slices.Clone(out[i*words:(i+1)*words]))
			}
		}
		for i := range min(len(got), len(want)) {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("slot of %d: descriptor %d is %v, want %v", slot, i, got[i], want[i])
			}
		}
		if len(got) != len(want) {
			t.Fatalf("slot of %d: %d descriptors, want %d", slot, len(got), len(want))
		}
	}
}
