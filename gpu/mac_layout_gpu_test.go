package gpu

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
)

// macDeviceLayout is a layout of pieces of src for CopyMACLayout, and
// what it should give: the layout as a buffer (zeros between the pieces)
// and dst's bytes after the copies.
type macDeviceLayout struct {
	l    Layout
	n    int64
	flat []byte
}

// randomMACDeviceLayout places count pieces of up to most bytes from
// hostSrc (uploaded at src) in a layout, each on a chunk after 0 to 2
// chunks of zeros, their sources at random offsets (some off a 16-byte
// boundary), every other piece copied to the next free bytes of dst from
// *dstAt (kept 16-byte aligned but for every fifth piece), whose expected
// bytes it writes into wantDst.
func randomMACDeviceLayout(rng *rand.Rand, hostSrc []byte, src, dst mem.Buffer, wantDst []byte, dstAt *int, count, most int) *macDeviceLayout {
	c := &macDeviceLayout{}
	at := 0
	for i := range count {
		at += rng.IntN(3) * MACLayoutAlign
		n := 1 + rng.IntN(most)
		from := rng.IntN(len(hostSrc) - n)
		if i%3 != 0 {
			from &^= 15
		}
		var to uint64
		if i%2 == 0 && *dstAt+n+8 <= len(wantDst) {
			if i%5 == 4 {
				*dstAt += 8
			}
			copy(wantDst[*dstAt:], hostSrc[from:from+n])
			to = dst.DevicePtr() + uint64(*dstAt)
			*dstAt = (*dstAt + n + 15) &^ 15
		}
		c.l.Add(int64(at), src.DevicePtr()+uint64(from), int64(n), to)
		c.flat = append(c.flat, make([]byte, at-len(c.flat))...)
		c.flat = append(c.flat, hostSrc[from:from+n]...)
		at = (at + n + MACLayoutAlign - 1) / MACLayoutAlign * MACLayoutAlign
	}
	tail := rng.IntN(3000)
	c.flat = append(c.flat, make([]byte, tail)...)
	c.n = int64(len(c.flat))
	return c
}

// testMACLayouts runs random layouts on device memory through
// CopyMACLayout with macs (nil: on the host), several outstanding at
// once (deviceLayouts), and compares each MAC with mac.Sum of the layout
// as a buffer and the destination with what the copies should have
// written.
func testMACLayouts(t *testing.T, d *CUDADevice, s *Stream, g *Gather, macs *MACer) {
	testDeviceLayouts(t, d, s, func(ctx context.Context, rng *rand.Rand, layouts []*macDeviceLayout) {
		var key mac.Key
		for i := range key {
			key[i] = byte(rng.Uint32())
		}
		pending := make([]*PendingMAC, len(layouts))
		for i, c := range layouts {
			var err error
			if pending[i], err = g.CopyMACLayout(ctx, &c.l, c.n, macs, &key); err != nil {
				t.Fatal(err)
			}
		}
		for i, c := range layouts {
			got, err := pending[i].Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pending[i].Close()
			if want := mac.Sum(&key, c.flat); got != want {
				t.Fatalf("layout %d (%d bytes): MAC %s, want %s", i, c.n, got, want)
			}
		}
	})
}

// testDeviceLayouts makes random layouts of device memory, has run queue
// and check their MACs, then checks the destination against what the
// copies should have written: layouts of 1 to 40 pieces of up to 256 KiB,
// one of 10,000 pieces of up to 300 bytes (several launches, the
// descriptor ring wrapping) and one of two 24 MiB pieces, and the last six
// again with no copies.
func testDeviceLayouts(t *testing.T, d *CUDADevice, s *Stream, run func(ctx context.Context, rng *rand.Rand, layouts []*macDeviceLayout)) {
	const size = 64 << 20
	hostSrc, src := uploaded(t, d, s, size, 81)
	dst := alloc(t, d, size)
	if err := s.Memset(dst, 0, size, 0); err != nil {
		t.Fatal(err)
	}
	wantDst := make([]byte, size)
	rng := rand.New(rand.NewPCG(81, 82))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var layouts []*macDeviceLayout
	dstAt := 0
	for i := range 12 {
		layouts = append(layouts, randomMACDeviceLayout(rng, hostSrc, src, dst, wantDst, &dstAt, 1+i*3, 256<<10))
	}
	layouts = append(layouts, randomMACDeviceLayout(rng, hostSrc, src, dst, wantDst, &dstAt, 10000, 300))
	layouts = append(layouts, randomMACDeviceLayout(rng, hostSrc, src, dst, wantDst, &dstAt, 2, 24<<20))
	for _, c := range layouts[8:] { // the same pieces only read
		r := &macDeviceLayout{n: c.n, flat: c.flat}
		for i := range c.l.sizes {
			r.l.Add(int64(c.l.at[i]), c.l.srcs[i], int64(c.l.sizes[i]), 0)
		}
		layouts = append(layouts, r)
	}
	run(ctx, rng, layouts)
	got := make([]byte, size)
	if err := s.CopyDtoH(got, dst, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	if i := diffAt(got, wantDst); i >= 0 {
		t.Fatalf("byte %d of the destination is %#x, want %#x", i, got[i], wantDst[i])
	}
}

// TestMACLayoutGPU runs testMACLayouts with the layout kernel.
func TestMACLayoutGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	testMACLayouts(t, d, s, testGather(t, s), testMACer(t, s))
}

// TestMACLayoutGPUOnHost runs testMACLayouts without a MACer: the copies
// through Copy, the MAC computed on the host.
func TestMACLayoutGPUOnHost(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	testMACLayouts(t, d, s, testGather(t, s), nil)
}

// BenchmarkMACLayout64x16MiB computes the MAC of a 1 GiB layout of 64
// pieces of 16 MiB, each in a buffer of its own: copied into 64 other
// buffers on the way (a receiver reading a sender's tensors into its own
// with a group secret), and only read (the sender's own pass), with keyed
// BLAKE3 (CopyMACLayout) and with Poly1305-AES (CopyPolyLayout). It
// reports GB/s of the layout's bytes; compare with BenchmarkMAC1GiB,
// BenchmarkPoly1GiB and BenchmarkGatherLayout64x16MiB.
func BenchmarkMACLayout64x16MiB(b *testing.B) {
	d := testDevice(b)
	const each, count = 16 << 20, 64
	srcs, dsts := make([]mem.Buffer, count), make([]mem.Buffer, count)
	for i := range srcs {
		srcs[i], dsts[i] = alloc(b, d, each), alloc(b, d, each)
	}
	ctx := context.Background()
	var key mac.Key
	for _, c := range []struct {
		name       string
		copy, poly bool
	}{{"copy+mac", true, false}, {"mac", false, false}, {"copy+poly", true, true}, {"poly", false, true}} {
		b.Run(c.name, func(b *testing.B) {
			var g *Gather
			var m *MACer
			var pm *PolyMACer
			var l Layout
			benchCopy(b, d, each*count, func(s *Stream) error {
				if g == nil {
					g = testGather(b, s)
					if c.poly {
						pm = testPolyMACer(b, s)
					} else {
						m = testMACer(b, s)
					}
				}
				for i := range count {
					var to uint64
					if c.copy {
						to = dsts[i].DevicePtr()
					}
					l.Add(int64(i)*each, srcs[i].DevicePtr(), each, to)
				}
				var err error
				if c.poly {
					var p *PendingPolyMAC
					if p, err = g.CopyPolyLayout(ctx, &l, each*count, pm, polyCheckKey, &polyCheckNonce); err == nil {
						_, err = p.Wait(ctx)
						p.Close()
					}
					return err
				}
				var p *PendingMAC
				if p, err = g.CopyMACLayout(ctx, &l, each*count, m, &key); err == nil {
					_, err = p.Wait(ctx)
					p.Close()
				}
				return err
			})
		})
	}
}
