package stages

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/checksum/checksumtest"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/transport"
	"github.com/weightcast/weightcast/wire"
)

// signedDirectGroup is a group of world ranks with a group secret whose
// receivers read the root's device tensors in place (direct buckets).
func signedDirectGroup(t *testing.T, d *gpu.CUDADevice, world int, keys *auth.Keys, kind mac.Kind) (*group, *directEP) {
	var ep *directEP
	g := newGPUGroup(t, d, world, 256<<10, false, true, func(r int, e transport.Endpoint) transport.Endpoint {
		if r == 0 {
			ep = &directEP{Endpoint: e}
			return ep
		}
		return e
	})
	g.sender.cfg.Auth, g.sender.cfg.BucketMAC = keys, kind
	for _, r := range g.receivers {
		r.cfg.Auth = keys
	}
	return g, ep
}

// macMetaPublisher notes, of each bucket's metadata it publishes (opened
// with the run's keys), whether the bucket was direct and carried a MAC
// and a checksum.
type macMetaPublisher struct {
	transport.Publisher
	keys                            *auth.Keys
	direct, macs, checksums, nonces atomic.Int64
}

func (p *macMetaPublisher) Publish(ctx context.Context, seq uint64, msg []byte) error {
	raw, err := wire.Open(p.keys, seq, msg)
	if err != nil {
		return err
	}
	if m, err := wire.DecodeMeta(raw); err == nil && len(m.Entries) > 0 {
		if m.Direct != nil {
			p.direct.Add(1)
		}
		if m.HasMAC {
			p.macs.Add(1)
		}
		if m.MACNonce != nil {
			p.nonces.Add(1)
		}
		if m.HasChecksum {
			p.checksums.Add(1)
		}
	}
	return p.Publisher.Publish(ctx, seq, msg)
}

// forgeOnPublish changes the first bytes of a tensor of the root's, in its
// device memory, checksum kept (forgeDevice), when the round's first
// bucket is published: after the root computed that bucket's MAC (a
// direct round's MACs come ahead of its messages, Sender.sumsFirst),
// before any receiver reads it.
type forgeOnPublish struct {
	transport.Publisher
	forge  func(ctx context.Context) error
	forged atomic.Bool
}

func (p *forgeOnPublish) Publish(ctx context.Context, seq uint64, msg []byte) error {
	if p.forged.CompareAndSwap(false, true) {
		if err := p.forge(ctx); err != nil {
			return err
		}
	}
	return p.Publisher.Publish(ctx, seq, msg)
}

// checkDirectMAC runs signed direct rounds, each bucket's MAC of kind: every bucket direct, none on
// the byte transport, each carrying its MAC and no checksum, received
// into a device model (load's copies compute the MAC), a host model
// (gathered with the MAC) and a sink reading in place (the MAC read
// there), every byte as sent; and rounds that mix in tensors a direct
// bucket cannot take, whose buckets are packed. Then a tensor changed in the root's memory
// after its MAC was computed, its checksum kept, fails the round on each
// kind of receiver, naming the tensor, before a sink reading in place
// gets a view and with a host model intact.
func checkDirectMAC(t *testing.T, kind mac.Kind) {
	d := gputest.Device(t)
	s := gputest.Stream(t, d)
	keys := testKeys(t, "direct")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	src, exp := directSource(t, d, s, 95, false)
	g, ep := signedDirectGroup(t, d, 3, keys, kind)
	pub := &macMetaPublisher{Publisher: g.sender.cfg.Publisher, keys: keys}
	g.sender.cfg.Publisher = pub
	st := runRounds(t, g, d, src, exp)
	if st.Direct != st.Buckets || ep.moved != 0 {
		t.Fatalf("with a secret: %d of %d buckets direct, %d broadcast; want all direct, none broadcast", st.Direct, st.Buckets, ep.moved)
	}
	if n := pub.direct.Load(); n != 2*int64(st.Buckets) || pub.macs.Load() != n || pub.checksums.Load() != 0 {
		t.Fatalf("of %d direct buckets published, %d carried a MAC and %d a checksum; want a MAC each, no checksum", n, pub.macs.Load(), pub.checksums.Load())
	}
	if want := map[mac.Kind]int64{mac.BLAKE3: 0, mac.Poly1305AES: pub.macs.Load()}[kind]; pub.nonces.Load() != want {
		t.Fatalf("%d of %d MACs carried a Poly1305-AES nonce; want %d", pub.nonces.Load(), pub.macs.Load(), want)
	}

	// Tensors a direct bucket cannot take mixed in: their buckets are
	// packed, with the MAC of their bytes, beside direct ones.
	msrc, mexp := directSource(t, d, s, 99, true)
	g, ep = signedDirectGroup(t, d, 3, keys, kind)
	if st := runRounds(t, g, d, msrc, mexp); st.Direct == 0 || st.Direct == st.Buckets || ep.moved != 2*(st.Buckets-st.Direct) {
		t.Fatalf("mixed, with a secret: %d of %d buckets direct, %d broadcast in two rounds; want some of each, the others broadcast", st.Direct, st.Buckets, ep.moved)
	}

	addrs := map[string]uint64{}
	for _, tn := range src {
		base, _ := gpu.Address(tn.Device)
		addrs[tn.Name] = base + uint64(tn.DeviceOffset)
	}
	g, _ = signedDirectGroup(t, d, 2, keys, kind)
	k := &inPlaceSink{s: s, addrs: addrs, inPlace: true}
	if err := roundCancel(ctx, g, src, 1, []Sink{k}); err != nil {
		t.Fatal(err)
	}
	at := 0
	for name, w := range exp {
		if !bytes.Equal(k.got[name], w.Data) {
			t.Fatalf("read in place: tensor %q differs (at byte %d)", name, gputest.FirstDiff(k.got[name], w.Data))
		}
		if k.at[name] {
			at++
		}
	}
	if at == 0 {
		t.Fatal("read in place: no view lay at the sender's address")
	}

	for i, c := range []struct {
		name string
		sink func() Sink
		want SinkState
	}{
		{"device model, read in place", func() Sink { return newDevModel(t, d) }, StatePartial},
		{"host model, gathered", func() Sink { return newMemModel() }, StateIntact},
		{"views in place", func() Sink { return &inPlaceSink{s: s, addrs: addrs, inPlace: true} }, StateIntact},
	} {
		src, _ := directSource(t, d, s, 96+uint64(i), false)
		var first *Tensor // the first tensor long enough to forge
		var size int64
		for _, tn := range src {
			if n, _ := tn.Validate(); n >= checksumtest.ForgedLen {
				first, size = tn, n
				break
			}
		}
		g, _ := signedDirectGroup(t, d, 2, keys, kind)
		fp := &forgeOnPublish{Publisher: g.sender.cfg.Publisher, forge: func(ctx context.Context) error {
			addr, _ := gpu.Address(first.Device)
			v, err := d.View(addr+uint64(first.DeviceOffset), int(size))
			if err != nil {
				return err
			}
			return forgeDevice(s)(ctx, v, int(size))
		}}
		g.sender.cfg.Publisher = fp
		sink := c.sink()
		err := roundCancel(ctx, g, src, 1, []Sink{sink})
		if err == nil || !strings.Contains(err.Error(), "failed its MAC") || !errors.Is(err, auth.ErrFailed) || !strings.Contains(err.Error(), first.Name) {
			t.Fatalf("%s: a tensor changed after its MAC (forged %v): %v; want a MAC failure naming %q", c.name, fp.forged.Load(), err, first.Name)
		}
		if st := g.receivers[0].State(); st != c.want {
			t.Fatalf("%s: State() = %v after the forgery, want %v", c.name, st, c.want)
		}
		if k, ok := sink.(*inPlaceSink); ok && k.loads != 0 {
			t.Fatalf("%s: the sink got %d views of a round whose first bucket failed its MAC", c.name, k.loads)
		}
		t.Logf("%s, expected: %v", c.name, err)
	}
}

// TestDirectMACOnFakes runs checkDirectMAC against gputest's stand-in
// driver, where the MAC kernels are missing: the MACs are computed on the
// host from the pieces read back.
func TestDirectMACOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestDirectMACOnFakesChild") }

// TestDirectMACOnFakesChild is the child side of TestDirectMACOnFakes.
func TestDirectMACOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	checkDirectMACs(t)
}

// TestGPUDirectMAC runs checkDirectMAC on a GPU, with the layout MAC
// kernels.
func TestGPUDirectMAC(t *testing.T) { checkDirectMACs(t) }

// checkDirectMACs runs checkDirectMAC with each bucket MAC.
func checkDirectMACs(t *testing.T) {
	for _, kind := range mac.Kinds {
		t.Run(string(kind), func(t *testing.T) { checkDirectMAC(t, kind) })
	}
}
