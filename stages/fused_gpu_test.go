package stages

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/transport"
)

// TestGPUFusedLoad checks the receiver's checksum computed by its copies:
// device tensors packed with checksums (the fused kernel at the root)
// into device buckets, received by one device model, whose copies out of
// each bucket compute its checksum (the Loader's CopySum) instead of a
// pass in unpack. The model holds every byte, and a byte flipped in a
// received bucket fails the round with the checksum's error and leaves
// the receiver's in-place model partial.
func TestGPUFusedLoad(t *testing.T) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	rng := rand.New(rand.NewPCG(81, 82))
	hostTs := randomTensors(rng, 120, 700<<10)
	exp := hostLookup{}
	var src tensorList
	for i, tn := range placeOnDevice(t, d, hostTs, 40, 3) {
		gputest.Upload(t, s, tn.Device, int(tn.DeviceOffset), hostTs[i].Data)
		src = append(src, tn)
		exp[tn.Name] = &Tensor{Name: tn.Name, DType: tn.DType, Shape: tn.Shape, Data: hostTs[i].Data}
	}
	gputest.Sync(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	g := newGPUGroup(t, d, 2, 1<<20, false, true, nil)
	dm := newDevModel(t, d)
	for v := uint64(1); v <= 2; v++ {
		if err := roundCancel(ctx, g, src, v, []Sink{dm}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := dm.Verify(ctx, exp); err != nil {
		t.Fatal(err)
	}
	ld := g.receivers[0].loader.loadCopy
	if ld == nil || ld.sums == nil {
		t.Fatal("the receiver did not compute its checksums in its copies")
	}
	if ok, why := ld.gather.SumKernel(); !ok {
		t.Fatalf("the fused kernel is unavailable: %v", why)
	}

	corrupt := func(r int, ep transport.Endpoint) transport.Endpoint {
		if r != 1 {
			return ep
		}
		return &flipEndpoint{Endpoint: ep, seq: 1, s: s}
	}
	g2 := newGPUGroup(t, d, 2, 1<<20, false, true, corrupt)
	dm2 := newDevModel(t, d)
	err := roundCancel(ctx, g2, src, 1, []Sink{dm2})
	if err == nil || !bytesContain(err.Error(), "failed its checksum") {
		t.Fatalf("a byte flipped in a received device bucket went unnoticed: %v", err)
	}
	if st := g2.receivers[0].State(); st != StatePartial {
		t.Fatalf("after a checksum failure found by the copies into the model, State() = %v, want partial", st)
	}
	t.Logf("expected: %v", err)
}
