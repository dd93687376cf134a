package stages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// inPlaceSink is a DeviceSink that says it reads direct buckets in place
// (InPlaceReader, as sink.Views does) when inPlace is set: it copies each
// view to the host at once and notes whether the view lay at the sender's
// own address for the tensor (addrs).
type inPlaceSink struct {
	s       *gpu.Stream
	addrs   map[string]uint64
	inPlace bool

	got   map[string][]byte
	at    map[string]bool // a whole tensor's view lay at the sender's address
	loads int             // LoadDevice calls
}

func (k *inPlaceSink) ReadsInPlace() bool { return k.inPlace }

func (k *inPlaceSink) Begin(ctx context.Context, version uint64, info *wire.SourceInfo) error {
	k.got, k.at = map[string][]byte{}, map[string]bool{}
	return nil
}

func (k *inPlaceSink) Load(ctx context.Context, e *wire.Entry, data []byte) error {
	return fmt.Errorf("tensor %q came as host bytes from a device bucket", e.Name)
}

func (k *inPlaceSink) LoadDevice(ctx context.Context, e *wire.Entry, src mem.Buffer, off int64) error {
	k.loads++
	if e.Chunk == 0 {
		k.got[e.Name] = make([]byte, e.Total)
	}
	if e.Size == 0 {
		return nil
	}
	if src == nil {
		return fmt.Errorf("tensor %q: a view of %d bytes without memory", e.Name, e.Size)
	}
	if err := k.s.CopyDtoH(k.got[e.Name][e.Chunk:e.Chunk+e.Size], gpu.Unfence(src), int(off)); err != nil {
		return err
	}
	if e.Whole() {
		at, _ := gpu.Address(src)
		k.at[e.Name] = at+uint64(off) == k.addrs[e.Name]
	}
	return nil
}

func (k *inPlaceSink) Flush(ctx context.Context) error                  { return nil }
func (k *inPlaceSink) Commit(ctx context.Context, version uint64) error { return nil }

var _ InPlaceReader = (*inPlaceSink)(nil)

// checkDirectViews runs rounds from a root whose receivers read in place
// into a sink that takes views in place: with checksums and without, every
// whole tensor's view lies at the sender's own address (no gather into the
// receiver's bucket), every byte as sent; the same sink not reading in
// place gets gathered views, the same bytes. Then a direct bucket whose
// checksum is not the sender's tensors' fails the round before the sink
// gets any view of it.
func checkDirectViews(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	src, exp := directSource(t, d, s, 94, false)
	addrs := map[string]uint64{}
	for _, tn := range src {
		base, _ := gpu.Address(tn.Device)
		addrs[tn.Name] = base + uint64(tn.DeviceOffset)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newGroup := func(sum bool) *group {
		return newGPUGroup(t, d, 2, 256<<10, false, sum, func(r int, e transport.Endpoint) transport.Endpoint {
			if r == 0 {
				return &directEP{Endpoint: e}
			}
			return e
		})
	}
	for _, c := range []struct{ sum, inPlace bool }{{true, true}, {false, true}, {true, false}, {false, false}} {
		g := newGroup(c.sum)
		k := &inPlaceSink{s: s, addrs: addrs, inPlace: c.inPlace}
		for version := uint64(1); version <= 2; version++ {
			if err := roundCancel(ctx, g, src, version, []Sink{k}); err != nil {
				t.Fatalf("%+v, version %d: %v", c, version, err)
			}
			at, whole := 0, 0
			for name, w := range exp {
				if !bytes.Equal(k.got[name], w.Data) {
					t.Fatalf("%+v, version %d: tensor %q differs (at byte %d)", c, version, name, gputest.FirstDiff(k.got[name], w.Data))
				}
				if in, ok := k.at[name]; ok && len(w.Data) > 0 {
					whole++
					if in {
						at++
					}
				}
			}
			want := 0
			if c.inPlace {
				want = whole
			}
			if whole == 0 || whole == len(exp) || at != want {
				t.Fatalf("%+v, version %d: %d of %d whole tensors at the sender's address (of %d tensors); want %d, and some split", c, version, at, whole, len(exp), want)
			}
		}
	}
	g := newGroup(true)
	g.sender.cfg.Publisher = &flipSumPublisher{Publisher: g.sender.cfg.Publisher, seq: 0}
	k := &inPlaceSink{s: s, addrs: addrs, inPlace: true}
	err := roundCancel(ctx, g, src, 1, []Sink{k})
	if err == nil || !strings.Contains(err.Error(), "failed its checksum") {
		t.Fatalf("a direct bucket with a wrong checksum went unnoticed by a sink reading in place: %v", err)
	}
	if k.loads != 0 {
		t.Fatalf("the sink got %d views of a round whose first bucket failed its checksum", k.loads)
	}
	if !errors.Is(err, ErrChecksum) {
		t.Fatalf("not ErrChecksum: %v", err)
	}
	t.Logf("expected: %v", err)
}

// TestDirectViewsOnFakes runs checkDirectViews against the stand-in
// driver (the checksums summed on the host where the layout kernel is
// missing).
func TestDirectViewsOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestDirectViewsOnFakesChild") }

// TestDirectViewsOnFakesChild is the child side of TestDirectViewsOnFakes.
func TestDirectViewsOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	checkDirectViews(t)
}

// TestGPUDirectViews runs checkDirectViews on a GPU, with the layout
// kernel.
func TestGPUDirectViews(t *testing.T) { checkDirectViews(t) }
