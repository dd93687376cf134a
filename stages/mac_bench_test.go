package stages

import (
	"context"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
	"github.com/weightcast/weightcast/gpu/gputest"
)

// BenchmarkSyncMAC measures what a group secret costs a sync on host
// buckets: rounds of 256 MiB (64 tensors of 4 MiB, 64 MiB buckets) from a
// Sender to one Receiver over the inproc transport and bus, "plain" with no
// check, "checksum" with the bucket checksum, and "secret" with the
// checksum, the bucket MAC (keyed BLAKE3 on every core, on both ends) and
// signed metadata. It reports GB/s of the model's bytes.
func BenchmarkSyncMAC(b *testing.B) {
	src := hostModel(64, 4<<20)
	for _, c := range []struct {
		name     string
		checksum bool
		secret   bool
	}{{"plain", false, false}, {"checksum", true, false}, {"secret", true, true}} {
		b.Run(c.name, func(b *testing.B) {
			o := groupOpts{world: 2, bucket: 64 << 20, checksum: c.checksum}
			if c.secret {
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
// group secret, waiting for each bucket's checksum and MAC as Publish does:
// the cost of the MAC kernel on the root's GPU, next to BenchmarkGPUPackDevice.
// It reports GB/s of bytes packed.
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
	for _, secret := range []bool{false, true} {
		b.Run(map[bool]string{false: "checksum", true: "secret"}[secret], func(b *testing.B) {
			pk := testPacker(b, defaultPlan, gpu.DefaultStagingConfig())
			pool := devicePool(b, d, DefaultBuffers, 256<<20)
			cfg := PackConfig{Pool: pool, Version: 1, Checksum: true}
			if secret {
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
			if secret && pk.dev.macs.macs.m == nil {
				b.Fatalf("the MACs were computed on the host: %v", pk.dev.macs.macs.why)
			}
		})
	}
}
