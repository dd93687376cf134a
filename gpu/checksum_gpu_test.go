package gpu

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/mem"
)

func testChecksummer(tb testing.TB, s *Stream) *Checksummer {
	tb.Helper()
	return testKernel(tb, s, "checksum", s.NewChecksummer)
}

// TestChecksumGPU checksums random device memory of many sizes (0 to
// 300 bytes, random sizes up to 1 MiB, 64 MiB + 3) at 16-byte aligned,
// 8-byte aligned and unaligned addresses, a batch of sums outstanding at
// once, and compares each with checksum.Sum of the same bytes.
func TestChecksumGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	c := testChecksummer(t, s)
	const size = 64<<20 + 64
	host, buf := uploaded(t, d, s, size, 31)
	rng := rand.New(rand.NewPCG(31, 32))
	type job struct{ off, n int }
	var jobs []job
	for n := range 301 {
		jobs = append(jobs, job{[]int{0, 8, 1, 3, 16, 5}[n%6], n})
	}
	for range 200 {
		jobs = append(jobs, job{rng.IntN(64), rng.IntN(1 << 20)})
	}
	jobs = append(jobs, job{0, 64<<20 + 3}, job{8, 64 << 20}, job{1, 64<<20 + 63})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for start := 0; start < len(jobs); start += 50 {
		batch := jobs[start:min(start+50, len(jobs))]
		sums := make([]*PendingSum, len(batch))
		for i, j := range batch {
			v, err := d.View(buf.DevicePtr()+uint64(j.off), j.n)
			if err != nil {
				t.Fatal(err)
			}
			if sums[i], err = c.Queue(v, int64(j.n)); err != nil {
				t.Fatal(err)
			}
		}
		for i, j := range batch {
			got, err := sums[i].Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if want := checksum.Sum(host[j.off : j.off+j.n]); got != want {
				t.Fatalf("%d bytes at offset %d: %#x, want %#x", j.n, j.off, got, want)
			}
			if again, err := sums[i].Wait(ctx); again != got || err != nil {
				t.Fatalf("a second Wait gave %#x, %v", again, err)
			}
			sums[i].Close()
		}
	}
	// A prefix of the buffer: n below Len.
	p, err := c.Queue(buf, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := p.Wait(ctx); err != nil || got != checksum.Sum(host[:1000]) {
		t.Fatalf("first 1000 bytes: %#x, %v", got, err)
	}
	p.Close()
}

// TestChecksumGPUOutstanding keeps 40 sums outstanding (five times the
// slots of one allocation), waits for them in reverse order, closes some
// unwaited and queues more (which reuse their slots once done), and
// checks what Wait says after the Checksummer is closed.
func TestChecksumGPUOutstanding(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	c, err := s.NewChecksummer()
	if err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	host, buf := uploaded(t, d, s, size, 41)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	queue := func(i int) *PendingSum {
		v, err := d.View(buf.DevicePtr()+uint64(i), size-2*i)
		if err != nil {
			t.Fatal(err)
		}
		p, err := c.Queue(v, int64(size-2*i))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	check := func(p *PendingSum, i int) {
		t.Helper()
		got, err := p.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := checksum.Sum(host[i : size-i]); got != want {
			t.Fatalf("sum %d: %#x, want %#x", i, got, want)
		}
	}
	var sums []*PendingSum
	for i := range 40 {
		sums = append(sums, queue(i))
	}
	if len(c.slots.slots) != 40 {
		t.Fatalf("%d slots for 40 outstanding sums", len(c.slots.slots))
	}
	for i := 39; i >= 20; i-- {
		check(sums[i], i)
		sums[i].Close()
	}
	for i := 10; i < 20; i++ {
		sums[i].Close() // unwaited: retired until done
	}
	for i := 10; i < 20; i++ {
		sums[i] = queue(i)
	}
	if len(c.slots.slots) != 40 {
		t.Fatalf("the pool grew to %d slots; 40 were enough", len(c.slots.slots))
	}
	for i := 10; i < 20; i++ {
		check(sums[i], i)
	}
	check(sums[0], 0)
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := sums[0].Wait(ctx); err != nil || got != checksum.Sum(host[:size]) {
		t.Fatalf("Wait after Close of a sum waited before: %#x, %v", got, err)
	}
	if _, err := sums[1].Wait(ctx); !errors.Is(err, ErrChecksummerClosed) {
		t.Fatalf("Wait after Close of a sum never waited: %v, want ErrChecksummerClosed", err)
	}
	if _, err := c.Queue(buf, 8); !errors.Is(err, ErrChecksummerClosed) {
		t.Fatalf("Queue after Close: %v", err)
	}
	for _, p := range sums {
		p.Close()
	}
	if err := c.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestChecksumGPURefuses checks Queue's errors (see checkRefuses), and
// that an empty sum needs no launch.
func TestChecksumGPURefuses(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	c := testChecksummer(t, s)
	checkRefuses(t, d, func(buf mem.Buffer, n int64) (func(), error) {
		p, err := c.Queue(buf, n)
		if err != nil {
			return nil, err
		}
		return p.Close, nil
	})
	p, err := c.Queue(alloc(t, d, 64), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := p.Wait(context.Background()); err != nil || got != checksum.Sum(nil) {
		t.Fatalf("empty sum: %#x, %v", got, err)
	}
}

// checkRefuses checks that queue, the Queue of a kernel that reads device
// memory, refuses host and pinned memory, lengths outside the buffer,
// freed buffers and another device's memory; queue returns what closes
// what it queued.
func checkRefuses(t *testing.T, d *CUDADevice, queue func(buf mem.Buffer, n int64) (func(), error)) {
	t.Helper()
	buf := alloc(t, d, 64)
	pinned := alloc(t, d.PinnedHost(), 64)
	hostBuf := alloc(t, mem.Host{}, 64)
	freed, err := d.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	freed.Free()
	for name, c := range map[string]struct {
		buf mem.Buffer
		n   int64
	}{
		"pinned":     {pinned, 8},
		"host":       {hostBuf, 8},
		"too long":   {buf, 65},
		"negative":   {buf, -1},
		"freed":      {freed, 8},
		"other view": {&viewBuffer{dev: &CUDADevice{ordinal: 7}, ptr: 4096, n: 64}, 8},
	} {
		if done, err := queue(c.buf, c.n); err == nil {
			done()
			t.Errorf("%s: Queue succeeded", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// TestChecksumGPUOff: ChecksumEnv=off makes NewChecksummer fail with
// ErrNoChecksumKernel (on a device opened afresh, which loads anew).
func TestChecksumGPUOff(t *testing.T) {
	t.Setenv(ChecksumEnv, "off")
	d := testDevice(t)
	s := testStream(t, d)
	if _, err := s.NewChecksummer(); !errors.Is(err, ErrNoChecksumKernel) {
		t.Fatalf("NewChecksummer with %s=off: %v", ChecksumEnv, err)
	}
}

// BenchmarkChecksum1GiB checksums 1 GiB of device memory per operation,
// Queue to Wait, and reports GB/s of bytes checksummed, with the default
// grid and with grids of 2 to 16 blocks per multiprocessor. Compare with
// BenchmarkCopyDtoD (a plain copy of the same bytes: it reads them and
// writes them again).
func BenchmarkChecksum1GiB(b *testing.B) {
	d := testDevice(b)
	s := testStream(b, d)
	c := testChecksummer(b, s)
	buf := alloc(b, d, benchBytes)
	if err := s.Memset(buf, 0, benchBytes, 0x5a); err != nil {
		b.Fatal(err)
	}
	sms, err := d.Multiprocessors()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	sum := func(b *testing.B) {
		p, err := c.Queue(buf, benchBytes)
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
			c.blocks = sms * perSM
			sum(b)
			b.SetBytes(benchBytes)
			b.ResetTimer()
			for range b.N {
				sum(b)
			}
			b.ReportMetric(float64(benchBytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}
