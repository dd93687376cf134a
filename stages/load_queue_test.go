package stages

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// targetFault is a device model whose Target fails for one tensor.
type targetFault struct {
	*devModel
	name string
}

func (f *targetFault) Target(ctx context.Context, e *wire.Entry) (buf mem.Buffer, off int64, err error) {
	if e.Name == f.name {
		return nil, 0, errInjected
	}
	return f.devModel.Target(ctx, e)
}

// checkLoadQueueFailures fails rounds whose load queues a bucket's copies
// into a device model while the bucket before is still on the GPU: a
// sink that refuses a tensor of a later bucket, a wrong checksum on a
// later bucket (direct buckets read in place, and buckets of this rank's
// pool). Each round fails with an error that names the tensor or the
// bucket, the model is left partial, every bucket buffer is back in the
// receiver's pool, and a good round follows on the same group.
func checkLoadQueueFailures(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	src, exp := directSource(t, d, s, 61, false)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	late := src[len(src)-3].Name // in one of the round's last buckets
	for _, c := range []struct {
		name   string
		direct bool
		fault  func(g *group) Sink
		want   string
	}{
		{"a tensor refused", true, func(g *group) Sink { return &targetFault{devModel: newDevModel(t, d), name: late} }, fmt.Sprintf("loading tensor %q", late)},
		{"a wrong checksum, in place", true, func(g *group) Sink {
			g.sender.cfg.Publisher = &flipSumPublisher{Publisher: g.sender.cfg.Publisher, seq: 3}
			return newDevModel(t, d)
		}, "failed its checksum"},
		{"a wrong checksum, in this rank's buckets", false, func(g *group) Sink {
			g.sender.cfg.Publisher = &flipSumPublisher{Publisher: g.sender.cfg.Publisher, seq: 3}
			return newDevModel(t, d)
		}, "failed its checksum"},
	} {
		wrap := func(r int, e transport.Endpoint) transport.Endpoint {
			if r == 0 && c.direct {
				return &directEP{Endpoint: e}
			}
			return e
		}
		g := newGPUGroup(t, d, 2, 256<<10, false, true, wrap)
		err := roundCancel(ctx, g, src, 1, []Sink{c.fault(g)})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: the round ended with %v, want an error with %q", c.name, err, c.want)
		}
		if st := g.receivers[0].State(); st != StatePartial {
			t.Fatalf("%s: State() = %v, want partial", c.name, st)
		}
		if held := g.pools[1].Held(); held != 0 {
			t.Fatalf("%s: %d of the receiver's bucket buffers still held after the failed round", c.name, held)
		}
		t.Logf("%s, expected: %v", c.name, err)

		// A receiver that failed is broken; a new group on the same
		// GPU takes the next round whole.
		g2 := newGPUGroup(t, d, 2, 256<<10, false, true, wrap)
		dm := newDevModel(t, d)
		if err := roundCancel(ctx, g2, src, 1, []Sink{dm}); err != nil {
			t.Fatalf("%s: the round after: %v", c.name, err)
		}
		if _, err := dm.Verify(ctx, exp); err != nil {
			t.Fatalf("%s: the round after: %v", c.name, err)
		}
	}
}

// TestLoadQueueFailuresOnFakes runs checkLoadQueueFailures against the
// stand-in driver.
func TestLoadQueueFailuresOnFakes(t *testing.T) {
	gputest.RunWithFakes(t, "TestLoadQueueFailuresOnFakesChild")
}

// TestLoadQueueFailuresOnFakesChild is the child side of
// TestLoadQueueFailuresOnFakes.
func TestLoadQueueFailuresOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	checkLoadQueueFailures(t)
}

// TestGPULoadQueueFailures runs checkLoadQueueFailures on a GPU.
func TestGPULoadQueueFailures(t *testing.T) { checkLoadQueueFailures(t) }
