package gpu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/checksum"
	"github.com/weightcast/weightcast/mem"
)

// testGatherLayout returns a Gather of s whose CopySumLayout uses the
// layout kernel, failing the test where it is unavailable, and a
// Checksummer of s.
func testGatherLayout(tb testing.TB, s *Stream) (*Gather, *Checksummer) {
	tb.Helper()
	g := testGather(tb, s)
	if ok, why := g.LayoutKernel(); !ok {
		tb.Fatalf("the layout kernel is unavailable on %s: %v", s.Device().Name(), why)
	}
	return g, testChecksummer(tb, s)
}

// deviceLayout places c's pieces in device memory: sources at srcAt in
// src, destinations at dstAt in dst.
func deviceLayout(c layoutCase, src, dst mem.Buffer, srcAt, dstAt int) *Layout {
	var l Layout
	for _, p := range c.pieces {
		var to uint64
		if p[3] >= 0 {
			to = dst.DevicePtr() + uint64(dstAt+p[3])
		}
		l.Add(int64(p[1]), src.DevicePtr()+uint64(srcAt+p[0]), int64(p[2]), to)
	}
	return &l
}

// TestGatherLayoutGPU runs random layouts on device memory, several
// outstanding at once, with the default pieces and with pieces of
// 16 KiB, plus a layout of 20,000 pieces of 64 bytes (several launches,
// the descriptor ring wrapping) and one of 64 MiB pieces, and compares
// the bytes copied and the sums with checksum.Sum of the layout built on
// the host.
func TestGatherLayoutGPU(t *testing.T) {
	d := testDevice(t)
	s := testStream(t, d)
	g, c := testGatherLayout(t, s)
	const size = 160 << 20
	src, dst := alloc(t, d, size), alloc(t, d, size)
	hostSrc, hostDst := pattern(size, 71), pattern(size, 72)
	if err := s.CopyHtoD(src, 0, hostSrc); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyHtoD(dst, 0, hostDst); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(71, 72))
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var cases []layoutCase
	for range 16 {
		cases = append(cases, randomLayout(rng, 1<<20+rng.IntN(4<<20), 1<<20))
	}
	var many layoutCase
	for i := range 20000 {
		many.pieces = append(many.pieces, [4]int{i * 80, i * 64, 64, i * 72})
	}
	many.n, many.src, many.dst = 20000*64, 20000*80, 20000*72
	big := layoutCase{n: 3 << 26, src: 2 << 26, dst: 2 << 26, pieces: [][4]int{{0, 0, 64 << 20, 0}, {64 << 20, 128 << 20, 64 << 20, -1}}}
	cases = append(cases, many, big)
	srcAt, dstAt := 0, 0
	type run struct {
		layout []byte
		sum    *PendingSum
	}
	var runs []run
	for i, lc := range cases {
		if srcAt+lc.src > size || dstAt+lc.dst > size {
			srcAt, dstAt = 0, 0
			for _, r := range runs { // the next cases reuse the memory
				if got, err := r.sum.Wait(ctx); err != nil || got != checksum.Sum(r.layout) {
					t.Fatalf("layout sum %#x, %v; want %#x", got, err, checksum.Sum(r.layout))
				}
				r.sum.Close()
			}
			runs = nil
		}
		layout := make([]byte, lc.n)
		for _, p := range lc.pieces {
			copy(layout[p[1]:p[1]+p[2]], hostSrc[srcAt+p[0]:srcAt+p[0]+p[2]])
			if p[3] >= 0 {
				copy(hostDst[dstAt+p[3]:dstAt+p[3]+p[2]], hostSrc[srcAt+p[0]:srcAt+p[0]+p[2]])
			}
		}
		g.chunk = 0 // the default pieces
		if i%2 == 1 {
			g.chunk = 16 << 10
		}
		ps, err := g.CopySumLayout(ctx, deviceLayout(lc, src, dst, srcAt, dstAt), int64(lc.n), c)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run{layout, ps})
		srcAt, dstAt = (srcAt+lc.src+15)&^15, (dstAt+lc.dst+15)&^15
	}
	for _, r := range runs {
		if got, err := r.sum.Wait(ctx); err != nil || got != checksum.Sum(r.layout) {
			t.Fatalf("layout sum %#x, %v; want %#x", got, err, checksum.Sum(r.layout))
		}
		r.sum.Close()
	}
	got := make([]byte, size)
	if err := s.CopyDtoH(got, dst, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	if i := diffAt(got, hostDst); i >= 0 {
		t.Fatalf("byte %d of the destination is %#x, want %#x", i, got[i], hostDst[i])
	}
}

// TestGatherLayoutGPUFallback turns the layout kernel off
// (GatherLayoutEnv) for a new device and checks that CopySumLayout still
// copies and sums, with Copy and a read back to the host, and that
// LayoutKernel says why.
func TestGatherLayoutGPUFallback(t *testing.T) {
	skipWithoutCUDA(t)
	t.Setenv(GatherLayoutEnv, "off")
	d := testDevice(t)
	s := testStream(t, d)
	g := testGather(t, s)
	c := testChecksummer(t, s)
	if ok, why := g.LayoutKernel(); ok || !errors.Is(why, ErrNoGatherLayoutKernel) {
		t.Fatalf("LayoutKernel() = %v, %v with %s=off", ok, why, GatherLayoutEnv)
	}
	rng := rand.New(rand.NewPCG(73, 74))
	lc := randomLayout(rng, 1<<20, 1<<16)
	src, dst := alloc(t, d, lc.src), alloc(t, d, lc.dst)
	hostSrc := pattern(lc.src, 73)
	if err := s.CopyHtoD(src, 0, hostSrc); err != nil {
		t.Fatal(err)
	}
	if err := s.Memset(dst, 0, lc.dst, 0); err != nil {
		t.Fatal(err)
	}
	want, layout := make([]byte, lc.dst), make([]byte, lc.n)
	for _, p := range lc.pieces {
		copy(layout[p[1]:p[1]+p[2]], hostSrc[p[0]:p[0]+p[2]])
		if p[3] >= 0 {
			copy(want[p[3]:p[3]+p[2]], hostSrc[p[0]:p[0]+p[2]])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := g.CopySumLayout(ctx, deviceLayout(lc, src, dst, 0, 0), int64(lc.n), c)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got, err := p.Wait(ctx); err != nil || got != checksum.Sum(layout) {
		t.Fatalf("CopySumLayout without the kernel: %#x, %v; want %#x", got, err, checksum.Sum(layout))
	}
	got := make([]byte, lc.dst)
	if err := s.CopyDtoH(got, dst, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	if i := diffAt(got, want); i >= 0 {
		t.Fatalf("byte %d differs", i)
	}
}

// BenchmarkGatherLayout64x16MiB moves a 1 GiB layout of 64 pieces of
// 16 MiB, each in a buffer of its own: copied into 64 other buffers with
// the layout summed on the way (a receiver reading a sender's tensors
// straight into its own), the same copies through the gather kernel alone,
// and the layout only summed (the sender's own pass). It reports GB/s of
// the layout's bytes; compare with BenchmarkGather64x16MiB/plain1GiB and
// BenchmarkChecksum1GiB.
func BenchmarkGatherLayout64x16MiB(b *testing.B) {
	d := testDevice(b)
	const each, count = 16 << 20, 64
	srcs, dsts := make([]mem.Buffer, count), make([]mem.Buffer, count)
	for i := range srcs {
		srcs[i], dsts[i] = alloc(b, d, each), alloc(b, d, each)
	}
	ctx := context.Background()
	var l Layout
	for _, c := range []struct {
		name string
		copy bool
		sum  bool
	}{{"copy+sum", true, true}, {"copy", true, false}, {"sum", false, true}} {
		b.Run(c.name, func(b *testing.B) {
			var g *Gather
			var cs *Checksummer
			benchCopy(b, d, each*count, func(s *Stream) error {
				if g == nil {
					g, cs = testGatherLayout(b, s)
				}
				var cb CopyBatch
				for i := range srcs {
					var to uint64
					if c.copy {
						to = dsts[i].DevicePtr()
					}
					l.Add(int64(i*each), srcs[i].DevicePtr(), each, to)
					cb.Add(dsts[i].DevicePtr(), srcs[i].DevicePtr(), each)
				}
				if !c.sum {
					l.Reset()
					return g.Copy(ctx, &cb)
				}
				p, err := g.CopySumLayout(ctx, &l, each*count, cs)
				if err != nil {
					return err
				}
				defer p.Close()
				_, err = p.Wait(ctx)
				return err
			})
		})
	}
}

// BenchmarkGatherLayoutBuckets is one receiver's loads of direct buckets
// of 256 MiB and 1 GiB (16 MiB tensors), each waited for before the next
// as the load stage does: the copies with the layout checksum, the copies
// alone, the copies with a slot cleared with cuMemsetD8Async before and
// read back after (what Checksummer.queue did before its kernels cleared
// their own slots, and still does for a sum of no launch), and with each
// of the two alone (copy+clear, copy+readback). Run in several processes
// at once it shows what sharing the GPU without MPS does to each.
func BenchmarkGatherLayoutBuckets(b *testing.B) {
	d := testDevice(b)
	const each = 16 << 20
	ctx := context.Background()
	for _, count := range []int{16, 64} {
		srcs, dsts := make([]mem.Buffer, count), make([]mem.Buffer, count)
		for i := range srcs {
			srcs[i], dsts[i] = alloc(b, d, each), alloc(b, d, each)
		}
		cleared := alloc(b, d, checksumSlotBytes) // copy+clear's
		for _, c := range []string{"copy+sum", "copy", "copy+slots", "copy+clear", "copy+readback"} {
			b.Run(fmt.Sprintf("bucket=%dMiB/%s", count*each>>20, c), func(b *testing.B) {
				var g *Gather
				var cs *Checksummer
				var l Layout
				benchCopy(b, d, int64(each*count), func(s *Stream) error {
					if g == nil {
						g, cs = testGatherLayout(b, s)
					}
					var cb CopyBatch
					for i := range srcs {
						l.Add(int64(i*each), srcs[i].DevicePtr(), each, dsts[i].DevicePtr())
						cb.Add(dsts[i].DevicePtr(), srcs[i].DevicePtr(), each)
					}
					var p *PendingSum
					var err error
					switch c {
					case "copy":
						l.Reset()
						return g.Copy(ctx, &cb)
					case "copy+slots":
						l.Reset()
						p, err = cs.queue(int64(each*count), func(*sumSlot) error { return g.Copy(ctx, &cb) })
					case "copy+clear": // a memset of the slots only
						l.Reset()
						if r := cuMemsetD8Async(s.d.ctx, cleared.DevicePtr(), 0, checksumSlotBytes, s.s); r != 0 {
							return s.d.err("cuMemsetD8Async", "", r)
						}
						return g.Copy(ctx, &cb)
					case "copy+readback": // the slots' read-back only
						l.Reset()
						sl, err := cs.slots.queue(func(*resultSlot) error { return g.Copy(ctx, &cb) })
						if err != nil {
							return err
						}
						defer cs.slots.release(sl, true)
						return cs.slots.wait(ctx, sl, "read-back")
					default:
						p, err = g.CopySumLayout(ctx, &l, int64(each*count), cs)
					}
					if err != nil {
						return err
					}
					defer p.Close()
					_, err = p.Wait(ctx)
					return err
				})
			})
		}
	}
}

// BenchmarkGatherLayoutModel copies and sums a whole model the way a
// colocated receiver's load stage does, bucket by bucket (1 GiB each,
// waiting for each bucket's sum): 300 tensors of 8 GiB in all, read from
// one allocation (a trainer's weights) into an allocation per tensor (a
// sink.DeviceModel), so that every bucket touches memory the last did
// not. model=1GiB copies a 1 GiB model of the same tensors eight times
// instead, the footprint of BenchmarkGatherLayoutBuckets; dst=one writes
// into one allocation. A rate below BenchmarkGatherLayoutBuckets' is what
// the footprint and the allocations cost the kernel.
func BenchmarkGatherLayoutModel(b *testing.B) {
	d := testDevice(b)
	for _, c := range []struct {
		name   string
		model  int64
		dstOne bool
	}{
		{"model=8GiB/dst=tensors", 8 << 30, false},
		{"model=8GiB/dst=one", 8 << 30, true},
		{"model=1GiB/dst=tensors", 1 << 30, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			count := int(300 * c.model / (8 << 30))
			each := (c.model / int64(count)) &^ 511
			src := alloc(b, d, int(each)*count)
			dsts := make([]uint64, count)
			var one mem.Buffer
			if c.dstOne {
				one = alloc(b, d, int(each)*count)
			}
			for i := range dsts {
				if c.dstOne {
					dsts[i] = one.DevicePtr() + uint64(int64(i)*each)
				} else {
					dsts[i] = alloc(b, d, int(each)).DevicePtr()
				}
			}
			benchModelBuckets(b, d, src.DevicePtr(), each, count, dsts, 0)
		})
	}
}

// benchModelBuckets is BenchmarkGatherLayoutModel's loop: 8 GiB a
// round, bucket by bucket (1 GiB each, waiting for each bucket's sum),
// from the model's byte stream of count tensors of each bytes lying back
// to back at src (round after round from where the last bucket ended),
// into the tensors at dsts, in pieces of chunk bytes (0: the default).
func benchModelBuckets(b *testing.B, d *CUDADevice, src uint64, each int64, count int, dsts []uint64, chunk uint64) {
	ctx := context.Background()
	const bucket = 1 << 30
	var g *Gather
	var cs *Checksummer
	var l Layout
	total := int64(8 << 30)
	model := each * int64(count)
	benchCopy(b, d, total, func(s *Stream) error {
		if g == nil {
			g, cs = testGatherLayout(b, s)
			g.chunk = chunk
		}
		for done := int64(0); done < total; done += bucket {
			// The model's byte stream from done%model, cut into
			// tensors' pieces.
			l.Reset()
			from := done % model
			for at := int64(0); at < bucket; {
				pos := (from + at) % model
				i, in := pos/each, pos%each
				n := min(each-in, bucket-at)
				l.Add(at, src+uint64(pos), n, dsts[i]+uint64(in))
				at += n
			}
			p, err := g.CopySumLayout(ctx, &l, bucket, cs)
			if err != nil {
				return err
			}
			_, err = p.Wait(ctx)
			p.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// ipcOwnerEnv makes TestGatherLayoutIPCOwner run, as the child process of
// BenchmarkGatherLayoutIPC: the number of bytes to allocate.
const ipcOwnerEnv = "WEIGHTCAST_GPU_IPC_OWNER"

// BenchmarkGatherLayoutIPC is BenchmarkGatherLayoutModel's 8 GiB model
// (dst=tensors) read from three places in one run: an allocation made
// before the tensors' (src=first, as BenchmarkGatherLayoutModel's), one
// made after them (src=after), and memory of another process mapped with
// CUDA IPC (src=ipc), as a colocated receiver reads the sender's tensors.
// A child process (this binary, TestGatherLayoutIPCOwner) allocates that
// model and exports it, then waits without GPU work until the benchmark
// ends. Each runs with pieces of 1 MiB (GatherChunk until 2026-12-03),
// 256 KiB (GatherChunk since) and 64 KiB: the kernel's blocks take the
// pieces in order, so smaller pieces keep the addresses they touch at
// once within fewer pages, and 1 GiB buckets of tensors cut into 1 MiB
// pieces make a few more than the grid's blocks. Rates that differ
// between the sources, for the same bytes, are the cost of where the
// model lies (docs/benchmarks.md, "Where the copies' rate goes: the
// model's placement").
func BenchmarkGatherLayoutIPC(b *testing.B) {
	d := testDevice(b)
	const count = 300
	const each = (int64(8<<30) / count) &^ 511
	first := alloc(b, d, int(each)*count)
	dsts := make([]uint64, count)
	for i := range dsts {
		dsts[i] = alloc(b, d, int(each)).DevicePtr()
	}
	after := alloc(b, d, int(each)*count)
	for _, src := range []string{"first", "after", "ipc"} {
		for _, chunk := range []uint64{1 << 20, 256 << 10, 64 << 10} {
			b.Run(fmt.Sprintf("src=%s/chunk=%dKiB", src, chunk>>10), func(b *testing.B) {
				from := first.DevicePtr()
				switch src {
				case "after":
					from = after.DevicePtr()
				case "ipc":
					from = openOwnerIPC(b, d, int(each)*count).DevicePtr()
				}
				benchModelBuckets(b, d, from, each, count, dsts, chunk)
			})
		}
	}
}

// openOwnerIPC starts TestGatherLayoutIPCOwner in a child process, which
// allocates n bytes and exports them, and maps them here; the child ends,
// freeing them, when tb does.
func openOwnerIPC(tb testing.TB, d *CUDADevice, n int) mem.Buffer {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestGatherLayoutIPCOwner$", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", ipcOwnerEnv, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	handles := make(chan string, 1)
	drained := make(chan struct{}) // closed once the child's output ends
	go func(out chan<- string) {
		defer close(drained)
		lines := bufio.NewScanner(stdout)
		for lines.Scan() { // to the end: the rest is its -test.v output
			if h, ok := strings.CutPrefix(lines.Text(), "ipc-handle "); ok && out != nil {
				out <- h
				close(out)
				out = nil
			}
		}
		if out != nil {
			close(out)
		}
	}(handles)
	tb.Cleanup(func() {
		stdin.Close() // the child frees the memory and ends
		t := time.NewTimer(30 * time.Second)
		defer t.Stop()
		select {
		case <-drained:
		case <-t.C:
			tb.Errorf("the owner process did not end 30 s after its input closed; killing it")
			cmd.Process.Kill()
			<-drained
		}
		if err := cmd.Wait(); err != nil {
			tb.Errorf("the owner process: %v", err)
		}
	})
	var handle string // "" if its output ended without one
	select {
	case handle = <-handles:
	case <-time.After(time.Minute):
		tb.Fatal("the owner process printed no handle within a minute")
	}
	if handle == "" {
		tb.Fatal("the owner process ended without exporting its memory")
	}
	h, err := ParseIPCHandle(handle)
	if err != nil {
		tb.Fatal(err)
	}
	buf, err := d.OpenIPC(h, n)
	if err != nil {
		tb.Fatal(err)
	}
	closeAtEnd(tb, buf.Free)
	return buf
}

// TestGatherLayoutIPCOwner is the child side of BenchmarkGatherLayoutIPC:
// it allocates the bytes ipcOwnerEnv names, writes them, exports them,
// prints the handle and waits for its standard input to close. It skips
// unless run by the benchmark.
func TestGatherLayoutIPCOwner(t *testing.T) {
	ns := os.Getenv(ipcOwnerEnv)
	if ns == "" {
		t.Skip("runs only as the child process of BenchmarkGatherLayoutIPC")
	}
	n, err := strconv.Atoi(ns)
	if err != nil {
		t.Fatal(err)
	}
	d := testDevice(t)
	s := testStream(t, d)
	buf := alloc(t, d, n)
	if err := s.Memset(buf, 0, n, 0x3C); err != nil {
		t.Fatal(err)
	}
	syncStream(t, s)
	h, err := d.ExportIPC(buf)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("ipc-handle %s\n", h)
	io.Copy(io.Discard, os.Stdin)
}

// BenchmarkGatherLayoutAfterIdle times the layout kernel's copy and sum of
// a 1 GiB bucket (64 pieces of 16 MiB) right after the GPU did something
// else, bucket after bucket as a round of the demo does: busy (the bucket
// before was copied just now), idle (300 ms without GPU work, the length
// of the demo's gap between rounds) and refilled (its source written by
// 300 ms of host-to-device copies first, as the demo refills the sender's
// model between rounds). It reports the first bucket's rate after the gap
// and the second's; a first bucket slower than the second, where busy
// shows none, is what the gap costs (docs/benchmarks.md, "After a gap,
// and the sum's block count").
func BenchmarkGatherLayoutAfterIdle(b *testing.B) {
	d := testDevice(b)
	ctx := context.Background()
	const each, count = 16 << 20, 64
	const bucket = each * count
	srcs, dsts := [2]mem.Buffer{alloc(b, d, bucket), alloc(b, d, bucket)}, [2]mem.Buffer{alloc(b, d, bucket), alloc(b, d, bucket)}
	host := alloc(b, d.PinnedHost(), 64<<20)
	for _, gap := range []string{"busy", "idle", "refilled"} {
		b.Run(gap, func(b *testing.B) {
			s := testStream(b, d)
			g, cs := testGatherLayout(b, s)
			copyBucket := func(k int) time.Duration {
				var l Layout
				for i := range count {
					l.Add(int64(i*each), srcs[k].DevicePtr()+uint64(i*each), each, dsts[k].DevicePtr()+uint64(i*each))
				}
				start := time.Now()
				p, err := g.CopySumLayout(ctx, &l, bucket, cs)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := p.Wait(ctx); err != nil {
					b.Fatal(err)
				}
				p.Close()
				return time.Since(start)
			}
			copyBucket(0) // warm up
			var first, second time.Duration
			for range b.N {
				b.StopTimer()
				switch gap {
				case "idle":
					time.Sleep(300 * time.Millisecond)
				case "refilled":
					for until := time.Now().Add(300 * time.Millisecond); time.Now().Before(until); {
						for off := 0; off < bucket; off += host.Len() {
							if err := s.CopyHtoD(srcs[0], off, host.Host()); err != nil {
								b.Fatal(err)
							}
						}
						syncStream(b, s)
					}
				}
				b.StartTimer()
				first += copyBucket(0)
				second += copyBucket(1)
			}
			b.ReportMetric(float64(bucket)*float64(b.N)/first.Seconds()/1e9, "first-GB/s")
			b.ReportMetric(float64(bucket)*float64(b.N)/second.Seconds()/1e9, "second-GB/s")
		})
	}
}

// BenchmarkGatherLayoutGrid sums 1 GiB where it lies (pieces without a
// destination, as a sender sums a direct bucket) cut into pieces of equal
// size, one block each: 1024, 1052, 1056, 1060 and 1088 of them. On one
// H200 the sender's 1 GiB buckets of 1056 pieces took 316-324 µs against
// 247-255 for those of 1024 and 1052 (Nsight Compute of the demo:
// docs/benchmarks.md, "Where a colocated round's time goes, from the GPU's
// own clock"). A rate that drops past some count here, for the same bytes,
// is the cost of a launch with more pieces than its grid has blocks (8
// per multiprocessor), whose last pieces run alone: on the H200, 1060
// pieces sum 20% slower than 1024 (docs/benchmarks.md, "After a gap, and
// the sum's block count").
func BenchmarkGatherLayoutGrid(b *testing.B) {
	d := testDevice(b)
	ctx := context.Background()
	const total = 1 << 30
	src := alloc(b, d, total)
	for _, pieces := range []int{1024, 1052, 1056, 1060, 1088} {
		b.Run(fmt.Sprintf("pieces=%d", pieces), func(b *testing.B) {
			each := int64(total/pieces) &^ 15
			var g *Gather
			var cs *Checksummer
			var l Layout
			benchCopy(b, d, each*int64(pieces), func(s *Stream) error {
				if g == nil {
					g, cs = testGatherLayout(b, s)
				}
				l.Reset()
				for i := range int64(pieces) {
					l.Add(i*each, src.DevicePtr()+uint64(i*each), each, 0)
				}
				p, err := g.CopySumLayout(ctx, &l, each*int64(pieces), cs)
				if err != nil {
					return err
				}
				defer p.Close()
				_, err = p.Wait(ctx)
				return err
			})
		})
	}
}
