package stages

import (
	"context"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
	"github.com/weightcast/weightcast/mac"
)

// BenchmarkSyncMAC measures what a group secret costs a sync on host
// buckets: rounds of 256 MiB (64 tensors of 4 MiB, 64 MiB buckets) from a
// Sender to one Receiver over the inproc transport and bus, "plain" with no
// check, "checksum" with the bucket checksum, and "secret" with the
// checksum, the bucket MAC (keyed BLAKE3 on every core, on both ends) and
// signed metadata, "secret-poly" the same with Poly1305-AES. It reports
// GB/s of the model's bytes.
func BenchmarkSyncMAC(b *testing.B) {
	src := hostModel(64, 4<<20)
	for _, c := range []struct {
		name     string
		checksum bool
		secret   mac.Kind // "": none
	}{{"plain", false, ""}, {"checksum", true, ""}, {"secret", true, mac.BLAKE3}, {"secret-poly", true, mac.Poly1305AES}} {
		b.Run(c.name, func(b *testing.B) {
			o := groupOpts{world: 2, bucket: 64 << 20, checksum: c.checksum, mac: c.secret}
			if c.secret != "" {
				o.auth = testKeys(b, "bench")
			}
			g := newGroup(b, o)
			sinks := []Sink{&countSink{}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			version := uint64(1)
			if err := g.round(ctx, src, version, sinks); err != nil { // pages touched, as in later rounds
				b.Fatal(err)
			}
			b.SetBytes(256 << 20)
			b.ResetTimer()
			for b.Loop() {
				version++
				if err := g.round(ctx, src, version, sinks); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGPUPackMAC packs 1 GiB of device tensors (64 allocations of
// 16 MiB) into 256 MiB device buckets with checksums, without and with a
// group secret (keyed BLAKE3, and Poly1305-AES: "secret-poly"), waiting for
// each bucket's checksum and MAC as Publish does: the cost of the MAC
// kernels on the root's GPU, next to BenchmarkGPUPackDevice. It reports
// GB/s of bytes packed.
func BenchmarkGPUPackMAC(b *testing.B) {
	d := gputest.Device(b)
	const total, each = 1 << 30, 16 << 20
	src := deviceTensors(b, d, total, each)
	wait := func(ctx context.Context, _ *gpu.Readback, bk *Bucket) error {
		if bk.sum != nil {
			if _, err := bk.sum.Wait(ctx); err != nil {
				return err
			}
		}
		return awaitMAC(ctx, bk)
	}
	for _, c := range []struct {
		name   string
		secret mac.Kind // "": none
	}{{"checksum", ""}, {"secret", mac.BLAKE3}, {"secret-poly", mac.Poly1305AES}} {
		b.Run(c.name, func(b *testing.B) {
			pk := testPacker(b, defaultPlan, gpu.DefaultStagingConfig())
			pool := devicePool(b, d, DefaultBuffers, 256<<20)
			cfg := PackConfig{Pool: pool, Version: 1, Checksum: true, MAC: c.secret}
			if c.secret != "" {
				cfg.Auth = testKeys(b, "bench")
			}
			for range 3 { // loads the kernels, settles the clocks
				if err := packRound(src, cfg, pk, wait); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(total)
			b.ResetTimer()
			for b.Loop() {
				if err := packRound(src, cfg, pk, wait); err != nil {
					b.Fatal(err)
				}
			}
			switch sm := &pk.dev.macs.macs; {
			case c.secret == mac.BLAKE3 && sm.m == nil:
				b.Fatalf("the MACs were computed on the host: %v", sm.why)
			case c.secret == mac.Poly1305AES && sm.polys == nil:
				b.Fatalf("the MACs were computed on the host: %v", sm.whyPoly)
			}
		})
	}
}
