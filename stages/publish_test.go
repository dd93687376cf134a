package stages

import (
	"testing"

	"github.com/weightcast/weightcast/wire"
)

// TestAheadOf: the head of a held run that goes out before the rest's
// checksums are in is what at least lead bytes of the run follow; a run
// shorter than lead waits whole.
func TestAheadOf(t *testing.T) {
	const G = 1 << 30
	run := func(lengths ...int64) []*Bucket {
		var r []*Bucket
		for _, n := range lengths {
			r = append(r, &Bucket{Meta: wire.BucketMeta{Length: n}})
		}
		return r
	}
	for _, c := range []struct {
		run  []*Bucket
		lead int64
		want int
	}{
		{run(G, G, G, G, G, G, G, G, G/2), 2 * G, 6}, // 8.5 GiB in 1 GiB buckets: the last three (2.5 GiB) wait
		{run(G, G, G, G, G, G, G, G, G/2), 0, 9},     // no lead: all at once
		{run(G, G), 2 * G, 0},                        // too short: the whole run waits
		{run(G, G, G), 2 * G, 1},
		{run(G/4, G/4, G/4, G/4, G/4, G/4, G/4, G/4, G/4, G/4), 2 * G, 2}, // 256 MiB buckets: eight wait
		{run(), 2 * G, 0},
		{run(0, 0, G), G, 2}, // buckets of no bytes go with the head
	} {
		if got := aheadOf(c.run, c.lead); got != c.want {
			t.Errorf("aheadOf(%d buckets, %d) = %d, want %d", len(c.run), c.lead, got, c.want)
		}
	}
}
