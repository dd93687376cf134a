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

// TestReserve checks where a descRing places its launches: after the
// last one, on 16-byte words, back at the start when the rest is too
// short; waiting for every older launch up to the newest one that reads
// descriptors it would rewrite, and for the oldest when too many are in
// flight.
func TestReserve(t *testing.T) {
	span := func(start, end int) ringSpan { return ringSpan{start: start, end: end} }
	for _, c := range []struct {
		name                   string
		head, size, want, word int
		flight                 []ringSpan
		max                    int
		start, wait            int
	}{
		{"empty ring", 0, 32, 8, 2, nil, 64, 0, 0},
		{"after the last launch", 3, 32, 8, 2, []ringSpan{span(0, 3)}, 64, 3, 0},
		{"odd words round up", 3, 32, 8, 3, []ringSpan{span(0, 3)}, 64, 4, 0},
		{"even words do not", 4, 32, 8, 3, []ringSpan{span(0, 4)}, 64, 4, 0},
		{"too short a rest wraps", 27, 32, 8, 2, []ringSpan{span(20, 27)}, 64, 0, 0},
		{"exactly the rest fits", 24, 32, 8, 2, []ringSpan{span(20, 24)}, 64, 24, 0},
		{"wrapping onto a launch waits for it", 30, 32, 8, 2,
			[]ringSpan{span(0, 8), span(8, 16), span(16, 24), span(24, 30)}, 64, 0, 1},
		{"and for the older ones before the newest it overlaps", 28, 32, 8, 2,
			[]ringSpan{span(24, 28), span(0, 5), span(5, 9), span(9, 20)}, 64, 0, 3},
		{"small launches far from the head", 10, 32, 8, 2,
			[]ringSpan{span(20, 22), span(22, 24), span(0, 4), span(4, 10)}, 64, 10, 0},
		{"an end that touches is no overlap", 8, 32, 8, 2, []ringSpan{span(16, 20), span(0, 8)}, 64, 8, 0},
		{"too many in flight", 6, 32, 2, 2,
			[]ringSpan{span(0, 1), span(1, 2), span(2, 3), span(3, 4), span(4, 5), span(5, 6)}, 4, 6, 3},
		{"overlap beyond the bound", 6, 32, 8, 2,
			[]ringSpan{span(12, 14), span(0, 2), span(2, 6)}, 2, 6, 2},
	} {
		start, wait := reserve(c.head, c.size, c.want, c.word, c.flight, c.max)
		if start != c.start || wait != c.wait {
			t.Errorf("%s: reserve = start %d, wait %d; want %d, %d", c.name, start, wait, c.start, c.wait)
		}
		if len(c.flight)-wait >= c.max {
			t.Errorf("%s: %d launches left in flight with the bound %d", c.name, len(c.flight)-wait, c.max)
		}
		for _, f := range c.flight[wait:] {
			if f.start < start+c.want && start < f.end {
				t.Errorf("%s: launch [%d, %d) left in flight under [%d, %d)", c.name, f.start, f.end, start, start+c.want)
			}
		}
	}
}
