package gpu

import (
	"encoding/binary"
	"testing"
)

// TestPTXRaise runs raise.ptx in the interpreter: a raise takes the larger
// of the word and the value, over the whole 64 bits, and touches nothing
// beside the word.
func TestPTXRaise(t *testing.T) {
	k := parsePTX(t, "raise.ptx", raisePTX)
	if k.name != "wc_raise" || len(k.params) != 2 || k.paramSize[0] != 8 || k.paramSize[1] != 8 {
		t.Fatalf("kernel %s(%v): want wc_raise(u64 word, u64 v)", k.name, k.params)
	}
	for _, c := range []struct{ word, v, want uint64 }{
		{5, 3, 5},
		{5, 9, 9},
		{0, 0, 0},
		{1 << 32, 0xffffffff, 1 << 32},      // a later round's group 0 over an earlier round's release
		{2<<32 | 7, 3<<32 | 0, 3<<32 | 0},   // the next round
		{1<<63 - 1, 1 << 63, 1 << 63},       // unsigned, not signed
		{1 << 63, ^uint64(0), ^uint64(0)},   // all ones
		{^uint64(0), 5<<32 | 1, ^uint64(0)}, // nothing lowers it
	} {
		mem := &ptxMemory{}
		b := make([]byte, 24)
		binary.LittleEndian.PutUint64(b[8:], c.word)
		mem.add(ptxBufBase, b)
		if err := k.run(mem, 1, 1, ptxBufBase+8, c.v); err != nil {
			t.Fatalf("raising %#x to %#x: %v", c.word, c.v, err)
		}
		if got := binary.LittleEndian.Uint64(b[8:]); got != c.want {
			t.Errorf("raising %#x to %#x gave %#x, want %#x", c.word, c.v, got, c.want)
		}
		if binary.LittleEndian.Uint64(b[:8]) != 0 || binary.LittleEndian.Uint64(b[16:]) != 0 {
			t.Errorf("raising %#x to %#x changed the words beside it", c.word, c.v)
		}
	}
}
