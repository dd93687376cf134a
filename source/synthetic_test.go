package source_test

import (
	"context"
	"testing"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
)

// TestSyntheticVerify: receivers regenerate a synthetic model's bytes and
// verify every one of them, round after round.
func TestSyntheticVerify(t *testing.T) {
	m, err := source.Synthetic{Size: 8 << 20, Tensors: 40, DTypes: []dtype.DType{dtype.BF16, dtype.F32}, Seed: 7}.Model()
	if err != nil {
		t.Fatal(err)
	}
	g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 3, Bucket: 1 << 20, Checksum: true})
	ctx := context.Background()
	vs := []*sink.Verifier{sink.Verify(m), sink.Verify(m)}
	for round := uint64(1); round <= 3; round++ {
		if err := g.Round(ctx, m, round, []stages.Sink{vs[0], vs[1]}); err != nil {
			t.Fatal(err)
		}
	}
	if v := vs[0]; v.Bytes != 3*m.Size() || v.Tensors != 3*len(m.List()) {
		t.Fatalf("verified %d bytes, %d tensors; model %d bytes, %d tensors", v.Bytes, v.Tensors, m.Size(), len(m.List()))
	}
}
