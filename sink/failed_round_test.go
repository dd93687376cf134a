package sink_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/weightcast/weightcast/safetensors/safetensorstest"
	"github.com/weightcast/weightcast/sink"
	"github.com/weightcast/weightcast/stages"
	"github.com/weightcast/weightcast/stages/stagestest"
)

// snapshot copies dir's files into a new directory and returns it.
func snapshot(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	for _, name := range safetensorstest.DirFiles(t, dir) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// TestSafetensorsFailedRoundIntact: a receiver that writes each round with
// WriteSafetensors, beside a sink that keeps nothing (combined with
// stages.Sinks, as the demo's --out and --verify are), still holds the last
// committed round's files, byte for byte, after a round that fails, and
// says so: State is intact, whether its own round failed after some
// tensors were written, or another receiver failed after this one had the
// whole round (its files are finished then, but only the group's commit
// puts them in place); and the Receiver has the sink drop the failed
// round's files.
func TestSafetensorsFailedRoundIntact(t *testing.T) {
	for _, c := range []struct {
		name    string
		failOwn bool
	}{{"own round fails mid-way", true}, {"another receiver fails", false}} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "out")
			files := sink.WriteSafetensors(dir, sink.SafetensorsWithoutSync())
			other := &failAfter{}
			bad := &failCommit{HostModel: sink.NewHostModel()}
			sinks := []stages.Sink{stages.Sinks(files, other), bad}
			g := stagestest.NewGroup(t, stagestest.GroupOptions{World: 3, Bucket: 64 << 10, Checksum: true})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := g.Round(ctx, roundModel(t, 1), 1, sinks); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, dir)
			if len(safetensorstest.DirFiles(t, before)) == 0 {
				t.Fatal("round 1 wrote no files")
			}
			if c.failOwn {
				other.n = 5
			} else {
				bad.fail = true
			}
			errs := g.RoundClosingOnError(ctx, roundModel(t, 2), 2, sinks)
			if errs[0] == nil || errs[1] == nil {
				t.Fatalf("the root or rank 1 reported success: %v", errs)
			}
			r := g.Receivers[0]
			if r.State() != stages.StateIntact || r.Committed() != 1 {
				t.Fatalf("rank 1: state %v, committed %d; want intact at 1 (%v)", r.State(), r.Committed(), errs[1])
			}
			safetensorstest.SameFiles(t, before, dir) // and no hidden round directory left behind
		})
	}
}
