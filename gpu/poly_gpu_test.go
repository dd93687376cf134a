package gpu

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mac"
)

func testPolyMACer(tb testing.TB, s *Stream) *PolyMACer {
	tb.Helper()
	return testKernel(tb, s, "Poly1305", s.NewPolyMACer)
}

// TestPolyGPU computes Poly1305-AES tags of random device memory of many
// sizes (0 to 3000 bytes, random sizes up to 1 MiB, 64 MiB and 64 MiB + 3)
// at 16-byte aligned and other addresses under random keys and nonces, a
// batch outstanding at once, and compares each with mac.PolySum of the same
// bytes. A changed byte changes the tag.
func TestPolyGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	m := testPolyMACer(t, s)
	const size = 64<<20 + 64
	host, buf := uploaded(t, d, s, size, 61)
	rng := rand.New(rand.NewPCG(61, 62))
	keys := make([]*mac.PolyKey, 3) // a few keys, as in a run: each has a table on the device
	for i := range keys {
		keys[i], _ = randomPolyKeyNonce(rng)
	}
	type job struct {
		off, n int
		key    *mac.PolyKey
		nonce  mac.Nonce
	}
	var jobs []job
	add := func(off, n int) {
		j := job{off: off, n: n, key: keys[len(jobs)%len(keys)]}
		for i := range j.nonce {
			j.nonce[i] = byte(rng.Uint32())
		}
		jobs = append(jobs, j)
	}
	for n := 0; n <= 3000; n += 1 + n/8 {
		add([]int{0, 16, 1, 4, 8}[n%5], n)
	}
	for range 100 {
		add(rng.IntN(64), rng.IntN(1<<20))
	}
	add(0, 64<<20)
	add(16, 64<<20+3)
	add(5, 64<<20+59)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	for start := 0; start < len(jobs); start += 40 {
		batch := jobs[start:min(start+40, len(jobs))]
		pending := make([]*PendingPolyMAC, len(batch))
		for i, j := range batch {
			v, err := d.View(buf.DevicePtr()+uint64(j.off), j.n)
			if err != nil {
				t.Fatal(err)
			}
			if pending[i], err = m.Queue(v, int64(j.n), j.key, &j.nonce); err != nil {
				t.Fatal(err)
			}
		}
		for i, j := range batch {
			got, err := pending[i].Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pending[i].Close()
			if want := mac.PolySum(j.key, &j.nonce, host[j.off:j.off+j.n]); got != want {
				t.Fatalf("%d bytes at offset %d: %s, want %s", j.n, j.off, got, want)
			}
		}
	}
	if len(m.tables) != len(keys) {
		t.Errorf("%d tables of powers for %d keys", len(m.tables), len(keys))
	}
	// One changed byte, in the middle of 64 MiB.
	before, err := m.Queue(buf, 64<<20, keys[0], &jobs[0].nonce)
	if err != nil {
		t.Fatal(err)
	}
	a, err := before.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before.Close()
	if err := s.Memset(buf, 32<<20+7, 1, host[32<<20+7]^1); err != nil {
		t.Fatal(err)
	}
	after, err := m.Queue(buf, 64<<20, keys[0], &jobs[0].nonce)
	if err != nil {
		t.Fatal(err)
	}
	b, err := after.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after.Close()
	if a == b {
		t.Error("a changed byte left the tag as it was")
	}
}

// TestPolyGPUClosed checks that Queue refuses after Close, and that a tag
// waited for before Close stays available.
func TestPolyGPUClosed(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	m, err := s.NewPolyMACer()
	if err != nil {
		t.Fatalf("the Poly1305 kernel is unavailable on %s: %v", d.Name(), err)
	}
	t.Cleanup(func() { m.Close(context.Background()) }) // after a failure; Close is idempotent
	_, buf := uploaded(t, d, s, 4096, 63)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := m.Queue(buf, 4096, polyCheckKey, &polyCheckNonce)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if again, err := p.Wait(ctx); err != nil || again != tag {
		t.Errorf("Wait after Close: %s, %v; want %s", again, err, tag)
	}
	p.Close()
	if _, err := m.Queue(buf, 4096, polyCheckKey, &polyCheckNonce); !errors.Is(err, ErrPolyMACerClosed) {
		t.Errorf("Queue after Close: %v, want ErrPolyMACerClosed", err)
	}
}

// BenchmarkPoly1GiB computes the Poly1305-AES tag of 1 GiB of device
// memory per operation, Queue to Wait, and reports GB/s of bytes MACed,
// with the default grid and with grids of 2 to 16 blocks per
// multiprocessor, and the keyed BLAKE3 MAC of the same bytes beside it.
// Compare with BenchmarkChecksum1GiB and BenchmarkMAC1GiB.
func BenchmarkPoly1GiB(b *testing.B) {
	d := testDevice(b)
	s := testStream(b, d)
	m := testPolyMACer(b, s)
	blake := testMACer(b, s)
	buf := alloc(b, d, benchBytes)
	if err := s.Memset(buf, 0, benchBytes, 0x5a); err != nil {
		b.Fatal(err)
	}
	sms, err := d.Multiprocessors()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	bench := func(b *testing.B, run func(b *testing.B)) {
		run(b)
		b.SetBytes(benchBytes)
		b.ResetTimer()
		for range b.N {
			run(b)
		}
		b.ReportMetric(float64(benchBytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
	}
	poly := func(b *testing.B) {
		p, err := m.Queue(buf, benchBytes, polyCheckKey, &polyCheckNonce)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		p.Close()
	}
	for _, perSM := range []int{checksumBlocksPerSM, 2, 4, 16} {
		b.Run(fmt.Sprintf("blocksPerSM=%d", perSM), func(b *testing.B) {
			m.blocks = sms * perSM
			bench(b, poly)
		})
	}
	b.Run("blake3", func(b *testing.B) {
		bench(b, func(b *testing.B) {
			p, err := blake.Queue(buf, benchBytes, &macCheckKey)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := p.Wait(ctx); err != nil {
				b.Fatal(err)
			}
			p.Close()
		})
	})
}

// testPolyLayouts runs testDeviceLayouts' layouts through CopyPolyLayout
// with polys (nil: on the host), several outstanding at once, and
// compares each tag with mac.PolySum of the layout as a buffer.
func testPolyLayouts(t *testing.T, d *CUDADevice, s *Stream, g *Gather, polys *PolyMACer) {
	testDeviceLayouts(t, d, s, func(ctx context.Context, rng *rand.Rand, layouts []*macDeviceLayout) {
		key, nonce := randomPolyKeyNonce(rng)
		pending := make([]*PendingPolyMAC, len(layouts))
		for i, c := range layouts {
			var err error
			if pending[i], err = g.CopyPolyLayout(ctx, &c.l, c.n, polys, key, nonce); err != nil {
				t.Fatal(err)
			}
		}
		for i, c := range layouts {
			got, err := pending[i].Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pending[i].Close()
			if want := mac.PolySum(key, nonce, c.flat); got != want {
				t.Fatalf("layout %d (%d bytes): tag %s, want %s", i, c.n, got, want)
			}
		}
	})
}

// TestPolyLayoutGPU runs testPolyLayouts with the layout kernel.
func TestPolyLayoutGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	testPolyLayouts(t, d, s, testGather(t, s), testPolyMACer(t, s))
}

// TestPolyLayoutGPUOnHost runs testPolyLayouts without a PolyMACer: the
// copies through Copy, the tag computed on the host.
func TestPolyLayoutGPUOnHost(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	testPolyLayouts(t, d, s, testGather(t, s), nil)
}
