package gpu

import (
	"testing"

	"github.com/weightcast/weightcast/mem"
)

// These tests need no GPU.

func TestCopyBatchMerge(t *testing.T) {
	var b CopyBatch
	b.Add(1000, 5000, 10)
	b.Add(1010, 5010, 6) // looks contiguous, may be another allocation: not merged
	b.Add(1100, 5016, 4)
	b.Add(2000, 9000, 0) // empty: ignored
	if b.Len() != 3 || b.Bytes() != 20 {
		t.Fatalf("Len %d Bytes %d, want 3 and 20", b.Len(), b.Bytes())
	}
	if dst, src, n, ok := b.Last(); !ok || dst != 1100 || src != 5016 || n != 4 {
		t.Fatalf("Last = %d %d %d %v", dst, src, n, ok)
	}
	if !b.Extend(60) {
		t.Fatal("Extend of a non-empty batch failed")
	}
	if _, _, n, _ := b.Last(); n != 64 || b.Bytes() != 80 {
		t.Fatalf("after Extend: last %d bytes, total %d", n, b.Bytes())
	}
	b.Reset()
	if b.Len() != 0 || b.Bytes() != 0 || b.Extend(1) {
		t.Fatal("Reset left copies behind")
	}
	if _, _, _, ok := b.Last(); ok {
		t.Fatal("Last of an empty batch")
	}
}

func TestFenceWrapping(t *testing.T) {
	h, _ := mem.Host{}.Alloc(64)
	if FenceOf(h) != nil || Unfence(h) != h {
		t.Fatal("a plain buffer has a fence")
	}
	e := &Event{}
	f := WithFence(h, e)
	if FenceOf(f) != e || Unfence(f) != h || f.Len() != 64 || &f.Host()[0] != &h.Host()[0] {
		t.Fatal("fenced buffer does not forward to its buffer")
	}
	e2 := &Event{}
	if g := WithFence(f, e2); FenceOf(g) != e2 || Unfence(g) != h {
		t.Fatal("re-fencing does not replace the fence")
	}
	if _, ok := Address(h); ok {
		t.Fatal("Go memory has a GPU address")
	}
}
