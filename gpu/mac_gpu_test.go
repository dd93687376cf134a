package gpu

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mac"
	"github.com/weightcast/weightcast/mem"
)

func testMACer(tb testing.TB, s *Stream) *MACer {
	tb.Helper()
	return testKernel(tb, s, "MAC", s.NewMACer)
}

// TestMACGPU computes MACs of random device memory of many sizes (0 to
// 3000 bytes, every chunk count to 70, random sizes up to 1 MiB, 64 MiB and
// 64 MiB + 3) at 16-byte aligned and other addresses under random keys, a
// batch outstanding at once, with parent launches of 1 to 5 levels, and
// compares each with mac.Sum of the same bytes.
func TestMACGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	m := testMACer(t, s)
	const size = 64<<20 + 64
	host, buf := uploaded(t, d, s, size, 51)
	rng := rand.New(rand.NewPCG(51, 52))
	type job struct {
		off, n int
		key    mac.Key
	}
	var jobs []job
	add := func(off, n int) {
		j := job{off: off, n: n}
		for i := range j.key {
			j.key[i] = byte(rng.Uint32())
		}
		jobs = append(jobs, j)
	}
	for n := 0; n <= 3000; n += 1 + n/8 {
		add([]int{0, 16, 1, 4, 8}[n%5], n)
	}
	for c := 1; c <= 70; c++ {
		add(16*rng.IntN(4), lastChunk(rng, c))
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
		m.levels = 1 + start/40%5
		macs := make([]*PendingMAC, len(batch))
		for i, j := range batch {
			v, err := d.View(buf.DevicePtr()+uint64(j.off), j.n)
			if err != nil {
				t.Fatal(err)
			}
			if macs[i], err = m.Queue(v, int64(j.n), &j.key); err != nil {
				t.Fatal(err)
			}
		}
		for i, j := range batch {
			got, err := macs[i].Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if want := mac.Sum(&j.key, host[j.off:j.off+j.n]); got != want {
				t.Fatalf("%d bytes at offset %d, %d levels per parent launch: %s, want %s", j.n, j.off, m.levels, got, want)
			}
			if again, err := macs[i].Wait(ctx); again != got || err != nil {
				t.Fatalf("a second Wait gave %s, %v", again, err)
			}
			macs[i].Close()
		}
	}
}

// TestMACGPUScratch grows the MACer's scratch while MACs that use the old
// one are outstanding (small, large, larger, small again) and checks every
// value, and what holds however fast the GPU is: the scratch grew twice,
// to twice the largest need; each outgrown scratch is either retired
// (waiting for the stream to pass its last use) or freed, and freed only
// with the MACs that used it done; once every MAC is done, the next Queue
// frees all of it.
func TestMACGPUScratch(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	m := testMACer(t, s)
	const size = 8 << 20
	host, buf := uploaded(t, d, s, size, 53)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sizes := []int{3000, 1 << 20, size, 5000, size - 1}
	var macs []*PendingMAC
	var scratch []mem.Buffer // every scratch the MACer had, in order
	users := map[mem.Buffer][]*PendingMAC{}
	for _, n := range sizes {
		p, err := m.Queue(buf, int64(n), &macCheckKey)
		if err != nil {
			t.Fatal(err)
		}
		macs = append(macs, p)
		if len(scratch) == 0 || scratch[len(scratch)-1] != m.scratch {
			scratch = append(scratch, m.scratch)
		}
		users[m.scratch] = append(users[m.scratch], p)
	}
	if want := 2 * size / mac.ChunkSize * macCVBytes; len(scratch) != 3 || m.scratch.Len() != want {
		t.Fatalf("the scratch was %d buffers, the last of %d bytes; want 3, the last of %d", len(scratch), m.scratch.Len(), want)
	}
	retired := map[mem.Buffer]bool{}
	for _, r := range m.old {
		retired[r.buf] = true
	}
	for i, b := range scratch[:2] {
		freed := b.DevicePtr() == 0
		if freed == retired[b] {
			t.Fatalf("outgrown scratch %d: freed %v, retired %v; want one or the other", i, freed, retired[b])
		}
		for _, p := range users[b] {
			if done, err := p.slot.ev.Query(); freed && (!done || err != nil) {
				t.Fatalf("outgrown scratch %d was freed while a MAC of %d bytes that used it was still running (%v)", i, p.n, err)
			}
		}
	}
	for i, p := range macs {
		got, err := p.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := mac.Sum(&macCheckKey, host[:sizes[i]]); got != want {
			t.Fatalf("%d bytes: %s, want %s", sizes[i], got, want)
		}
		p.Close()
	}
	p, err := m.Queue(buf, 2048, &macCheckKey)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if len(m.old) != 0 {
		t.Fatalf("%d outgrown scratch buffers kept after their MACs were done", len(m.old))
	}
	for i, b := range scratch[:2] {
		if b.DevicePtr() != 0 {
			t.Fatalf("outgrown scratch %d not freed after its MACs were done", i)
		}
	}
	if m.scratch != scratch[2] || m.scratch.DevicePtr() == 0 {
		t.Fatal("the scratch in use changed or was freed")
	}
}

// TestMACGPUClose checks what a MACer's Close leaves: values waited for
// stay, MACs never waited for fail with ErrMACerClosed, Queue refuses, and
// a second Close does nothing.
func TestMACGPUClose(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	m, err := s.NewMACer()
	if err != nil {
		t.Fatal(err)
	}
	host, buf := uploaded(t, d, s, 1<<20, 55)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var macs []*PendingMAC
	for i := range 12 {
		p, err := m.Queue(buf, int64(1<<20-i), &macCheckKey)
		if err != nil {
			t.Fatal(err)
		}
		macs = append(macs, p)
	}
	got, err := macs[0].Wait(ctx)
	if err != nil || got != mac.Sum(&macCheckKey, host) {
		t.Fatalf("MAC of 1 MiB: %s, %v", got, err)
	}
	macs[2].Close() // unwaited: retired until done
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if again, err := macs[0].Wait(ctx); err != nil || again != got {
		t.Fatalf("Wait after Close of a MAC waited before: %s, %v", again, err)
	}
	if _, err := macs[1].Wait(ctx); !errors.Is(err, ErrMACerClosed) {
		t.Fatalf("Wait after Close of a MAC never waited: %v, want ErrMACerClosed", err)
	}
	if _, err := m.Queue(buf, 8, &macCheckKey); !errors.Is(err, ErrMACerClosed) {
		t.Fatalf("Queue after Close: %v", err)
	}
	for _, p := range macs {
		p.Close()
	}
	if err := m.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestMACGPUFence checks that Queue orders the MAC after a buffer's fence:
// the MAC of bytes still being written by another stream when it is queued
// is that of the bytes written.
func TestMACGPUFence(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	other := testStream(t, d)
	m := testMACer(t, s)
	const size = 64 << 20
	buf := alloc(t, d, size)
	if err := other.Memset(buf, 0, size, 0x11); err != nil {
		t.Fatal(err)
	}
	host := pattern(size, 57)
	if err := other.CopyHtoD(buf, 0, host); err != nil {
		t.Fatal(err)
	}
	ev, err := other.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	p, err := m.Queue(WithFence(buf, ev), size, &macCheckKey)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got, err := p.Wait(ctx); err != nil || got != mac.Sum(&macCheckKey, host) {
		t.Fatalf("MAC after the fence: %s, %v", got, err)
	}
}

// TestMACGPURefuses checks Queue's errors (see checkRefuses).
func TestMACGPURefuses(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	m := testMACer(t, s)
	checkRefuses(t, d, func(buf mem.Buffer, n int64) (func(), error) {
		p, err := m.Queue(buf, n, &macCheckKey)
		if err != nil {
			return nil, err
		}
		return p.Close, nil
	})
}

// TestMACGPUOff: MACEnv=off makes NewMACer fail with ErrNoMACKernel (on a
// device opened afresh, which loads anew).
func TestMACGPUOff(t *testing.T) {
	t.Setenv(MACEnv, "off")
	d := testDevice(t)
	s := testStream(t, d)
	if _, err := s.NewMACer(); !errors.Is(err, ErrNoMACKernel) {
		t.Fatalf("NewMACer with %s=off: %v", MACEnv, err)
	}
}

// BenchmarkMAC1GiB computes the MAC of 1 GiB of device memory per
// operation, Queue to Wait, and reports GB/s of bytes MACed, with parent
// launches of 1 to 5 levels (the default is macParentLevels). Compare with
// BenchmarkChecksum1GiB and BenchmarkCopyDtoD (a plain copy of the same
// bytes).
func BenchmarkMAC1GiB(b *testing.B) {
	d := testDevice(b)
	s := testStream(b, d)
	m := testMACer(b, s)
	buf := alloc(b, d, benchBytes)
	if err := s.Memset(buf, 0, benchBytes, 0x5a); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	run := func(b *testing.B) {
		p, err := m.Queue(buf, benchBytes, &macCheckKey)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		p.Close()
	}
	for _, levels := range []int{macParentLevels, 1, 2, 4, 5} {
		b.Run(fmt.Sprintf("levels=%d", levels), func(b *testing.B) {
			m.levels = levels
			run(b)
			b.SetBytes(benchBytes)
			b.ResetTimer()
			for range b.N {
				run(b)
			}
			b.ReportMetric(float64(benchBytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
