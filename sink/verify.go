package sink

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/wire"
)

// Verify returns a stages.Sink that compares every received byte with the
// tensor of the same name in want (regenerating or re-reading it), and
// fails on the first difference, naming the tensor and the byte offset. It
// counts the bytes it checked.
func Verify(want stages.Lookuper) *Verifier { return &Verifier{want: want} }

// Verifier is the stages.Sink returned by Verify.
type Verifier struct {
	want    stages.Lookuper
	scratch []byte
	round   int // tensors completed this round
	// Bytes and Tensors count everything verified so far.
	Bytes   int64
	Tensors int
}

// Holding is HoldsNothing: a verifier keeps no copy of the model.
func (v *Verifier) Holding() stages.Holding { return stages.HoldsNothing }

// Load compares the entry's bytes with the source's, in 1 MiB pieces.
func (v *Verifier) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	t, ok := v.want.Lookup(e.Name)
	if !ok {
		return fmt.Errorf("received tensor %q that the source does not have", e.Name)
	}
	if t.DType != e.DType || !slices.Equal(t.Shape, e.Shape) {
		return fmt.Errorf("tensor %q arrived as %s%v, the source has %s%v", e.Name, e.DType, e.Shape, t.DType, t.Shape)
	}
	// Compare in pieces, so checking a bucket-sized chunk costs a small
	// scratch buffer, not a second bucket.
	const piece = 1 << 20
	if v.scratch == nil {
		v.scratch = make([]byte, piece)
	}
	for off := 0; off < len(data); off += piece {
		got := data[off:min(off+piece, len(data))]
		exp := v.scratch[:len(got)]
		if err := t.ReadAt(exp, e.Chunk+int64(off)); err != nil {
			return err
		}
		if !bytes.Equal(exp, got) {
			i := 0
			for i < len(got) && got[i] == exp[i] {
				i++
			}
			return fmt.Errorf("tensor %q differs from the source at byte %d (received %#02x, expected %#02x)", e.Name, e.Chunk+int64(off+i), got[i], exp[i])
		}
	}
	v.Bytes += int64(len(data))
	if e.Complete() {
		v.Tensors++
		v.round++
	}
	return nil
}

// Commit checks that the round brought every tensor of the source, when
// the source can list them (as source.Synthetic's model can).
func (v *Verifier) Commit(ctx context.Context, version uint64) error {
	got := v.round
	v.round = 0
	if l, ok := v.want.(interface{ List() []*stages.Tensor }); ok && got != len(l.List()) {
		return fmt.Errorf("round %d brought %d tensors, the source has %d", version, got, len(l.List()))
	}
	return nil
}
