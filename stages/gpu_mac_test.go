package stages

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/checksum/checksumtest"
	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
	"github.com/weightcast/weightcast/transport"
)

// TestGPUMAC runs the device paths of the bucket MAC on a GPU, with the
// MAC kernel (unless WEIGHTCAST_GPU_MAC=off): see deviceMACRounds.
func TestGPUMAC(t *testing.T) {
	d := gputest.Device(t)
	t.Run("blake3", func(t *testing.T) { deviceMACRounds(t, d, mac.BLAKE3, os.Getenv(gpu.MACEnv) != "off") })
	t.Run("poly1305-aes", func(t *testing.T) { deviceMACRounds(t, d, mac.Poly1305AES, os.Getenv(gpu.PolyEnv) != "off") })
}

// TestDeviceMACOnFakes runs the device paths of the bucket MAC against
// gputest's stand-in CUDA driver, where the MAC kernel is unavailable: both
// ends then compute the MAC on the CPU after copying the bucket back.
func TestDeviceMACOnFakes(t *testing.T) { gputest.RunWithFakes(t, "TestDeviceMACOnFakesChild") }

// TestDeviceMACOnFakesChild is the child side of TestDeviceMACOnFakes.
func TestDeviceMACOnFakesChild(t *testing.T) {
	gputest.InFakeChild(t)
	for _, kind := range mac.Kinds {
		t.Run(string(kind), func(t *testing.T) { deviceMACRounds(t, gputest.Device(t), kind, false) })
	}
}

// deviceMACRounds checks the bucket MAC of kind of device buckets on d,
// computed by its kernels where kernel is set, else on the CPU after a
// copy back: each packed device bucket's MAC equals mac.Sum (or
// mac.PolySum under its nonce) of its bytes; signed
// rounds from a root with device buckets and from one with host buckets
// pass on receivers with device buckets (a device sink with a verifier,
// and a host sink); and a bucket forged on a receiver's GPU, its checksum
// kept, fails the round with a MAC mismatch naming it.
func deviceMACRounds(t *testing.T, d *gpu.CUDADevice, kind mac.Kind, kernel bool) {
	s := gputest.Stream(t, d)
	keys := testKeys(t, "gpu")
	rng := rand.New(rand.NewPCG(41, 42))
	src := randomTensors(rng, 60, 700<<10)
	exp := hostLookup{}
	for _, tn := range src {
		exp[tn.Name] = tn
	}
	const bucket = 256 << 10
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Where each MAC was computed: by the kernel, or on the host.
	checkPath := func(where string, m *deviceMAC) {
		t.Helper()
		made, why, unavailable := m.macs.m != nil, m.macs.why, gpu.ErrNoMACKernel
		if kind == mac.Poly1305AES {
			made, why, unavailable = m.macs.polys != nil, m.macs.whyPoly, gpu.ErrNoPolyKernel
		}
		switch {
		case kernel && !made:
			t.Fatalf("%s: no %s kernel (%v)", where, kind, why)
		case !kernel && !errors.Is(why, unavailable):
			t.Fatalf("%s: the MACs were not computed on the host (kernel %v, %v)", where, made, why)
		}
	}

	pool := devicePool(t, d, DefaultBuffers, bucket)
	pk := testPacker(t, defaultPlan, gpu.DefaultStagingConfig())
	n := 0
	err := packRound(src, PackConfig{Pool: pool, Version: 1, Checksum: true, Auth: keys, MAC: kind}, pk, func(ctx context.Context, rb *gpu.Readback, bk *Bucket) error {
		if !bk.Meta.HasMAC || bk.auth != keys || bk.mac == nil {
			return fmt.Errorf("bucket %d: no MAC pending (HasMAC %v)", bk.Meta.Seq, bk.Meta.HasMAC)
		}
		if err := awaitMAC(ctx, bk); err != nil { // as Publish does
			return err
		}
		host, err := rb.Read(ctx, bk.Buf, int(bk.Meta.Length))
		if err != nil {
			return err
		}
		if (bk.Meta.MACNonce != nil) != (kind == mac.Poly1305AES) {
			return fmt.Errorf("bucket %d: a %s MAC with nonce %v", bk.Meta.Seq, kind, bk.Meta.MACNonce)
		}
		want := mac.Sum(bucketKey(keys), host)
		if kind == mac.Poly1305AES {
			want = mac.PolySum(polyKey(keys), bk.Meta.MACNonce, host).AsTag()
		}
		if bk.Meta.MAC != want {
			return fmt.Errorf("bucket %d (%d bytes): MAC %v, of its bytes %v", bk.Meta.Seq, bk.Meta.Length, bk.Meta.MAC, want)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkPath("pack", &pk.dev.macs)
	t.Logf("%d packed buckets, each MAC equal to mac.Sum of its bytes", n)

	signed := func(g *group) *group {
		g.sender.cfg.Auth, g.sender.cfg.BucketMAC = keys, kind
		for _, r := range g.receivers {
			r.cfg.Auth = keys
		}
		return g
	}
	for _, rootHost := range []bool{false, true} {
		g := signed(newGPUGroup(t, d, 3, bucket, rootHost, true, nil))
		dm := newDevModel(t, d)
		hm := newMemModel()
		if err := roundCancel(ctx, g, src, 1, []Sink{Sinks(dm, verify(exp)), hm}); err != nil {
			t.Fatalf("root with host buckets %v: %v", rootHost, err)
		}
		if _, err := dm.Verify(ctx, exp); err != nil {
			t.Fatal(err)
		}
		for name, w := range exp {
			if got, ok := hm.Get(name); !ok || string(got.Data) != string(w.Data) {
				t.Fatalf("the host model's %s differs", name)
			}
		}
		for i, r := range g.receivers {
			checkPath(fmt.Sprintf("receiver %d", i+1), &r.loader.check.macs)
		}
		if !rootHost {
			checkPath("root", &g.sender.packer.dev.macs)
		}
	}

	// (A root whose receivers read its tensors in place sends direct
	// buckets with their MACs: see checkDirectMAC.)
	dsrc, dexp := directSource(t, d, s, 43, false)

	// Receivers that borrow the root's buffers check the MAC in them; a
	// bucket changed in the root's buffer after its MAC was computed (as
	// by a process that opened its IPC handle) fails the round.
	lenders := make([]*lendEP, 2)
	lending := func(r int, e transport.Endpoint) transport.Endpoint {
		if r == 0 {
			return e
		}
		lenders[r-1] = &lendEP{devLoopEP: e.(*devLoopEP)}
		return lenders[r-1]
	}
	runRounds(t, signed(newGPUGroup(t, d, 3, bucket, false, true, lending)), d, dsrc, dexp)
	fl := &forgingLender{lendEP: &lendEP{}, forge: forgeDevice(s), target: 1}
	g := signed(newGPUGroup(t, d, 2, bucket, false, true, func(r int, e transport.Endpoint) transport.Endpoint {
		if r == 0 {
			return e
		}
		fl.devLoopEP = e.(*devLoopEP)
		return fl
	}))
	err = roundCancel(ctx, g, dsrc, 1, []Sink{newDevModel(t, d)})
	if err == nil || !strings.Contains(err.Error(), "bucket 1 (version 1, ") || !strings.Contains(err.Error(), "failed its MAC") || !fl.forged {
		t.Fatalf("a lent bucket forged in the root's buffer (forged %v): %v", fl.forged, err)
	}

	for _, sink := range []string{"device", "host"} {
		fe := &forgingEndpoint{forge: forgeDevice(s)}
		fe.target.Store(1 + 1) // bucket 1
		g := signed(newGPUGroup(t, d, 2, bucket, false, true, func(r int, ep transport.Endpoint) transport.Endpoint {
			if r != 1 {
				return ep
			}
			fe.Endpoint = ep
			return fe
		}))
		var sk Sink = newMemModel()
		if sink == "device" {
			sk = newDevModel(t, d)
		}
		err := roundCancel(ctx, g, src, 1, []Sink{sk})
		if err == nil || !strings.Contains(err.Error(), "bucket 1 (version 1, ") || !strings.Contains(err.Error(), "failed its MAC") || !errors.Is(err, auth.ErrFailed) {
			t.Fatalf("%s sink: a forged device bucket: %v", sink, err)
		}
		if !fe.forged.Load() {
			t.Fatalf("%s sink: bucket 1 was never forged", sink)
		}
		t.Logf("%s sink, expected: %v", sink, err)
	}
}

// forgingLender lends the root's buffers, forging bucket target in the
// root's buffer before lending it.
type forgingLender struct {
	*lendEP
	forge  func(ctx context.Context, buf mem.Buffer, n int) error
	target uint64
	forged bool
}

func (f *forgingLender) Lend(ctx context.Context, seq uint64, n int) (mem.Buffer, func(error) error, error) {
	buf, release, err := f.lendEP.Lend(ctx, seq, n)
	if err == nil && seq == f.target {
		f.forged = true
		if err = f.forge(ctx, buf, n); err != nil {
			release(err)
		}
	}
	return buf, release, err
}

// forgeDevice forges a device bucket on stream s: its first bytes copied
// back, forged keeping the checksum, and written again.
func forgeDevice(s *gpu.Stream) func(ctx context.Context, buf mem.Buffer, n int) error {
	return func(ctx context.Context, buf mem.Buffer, n int) error {
		b := make([]byte, n)
		if err := s.CopyDtoH(b, buf, 0); err != nil {
			return err
		}
		if err := s.Sync(ctx); err != nil {
			return err
		}
		sum := checksum.Sum(b)
		checksumtest.Forge(b, 0)
		if checksum.Sum(b) != sum {
			return errors.New("the forgery changed the checksum")
		}
		if err := s.CopyHtoD(buf, 0, b[:checksumtest.ForgedLen]); err != nil {
			return err
		}
		return s.Sync(ctx)
	}
}
