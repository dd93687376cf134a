package gpu

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weightcast/weightcast/mem"
)

// TestCUDAWaitValue: work queued behind WaitValue does not run until
// another stream's WriteValue reaches the value, and then it does.
func TestCUDAWaitValue(t *testing.T) {
	d := testDevice(t)
	waiter, writer := testStream(t, d), testStream(t, d)
	word := alloc(t, d, 4)
	buf := alloc(t, d, 1<<20)
	for _, s := range []*Stream{waiter, writer} {
		if err := s.Memset(word, 0, 4, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.Memset(buf, 0, 1<<20, 0); err != nil {
			t.Fatal(err)
		}
		syncStream(t, s)
	}
	t.Cleanup(func() { // if the test failed before the waiter was let go
		if err := writer.WriteValue(word.DevicePtr(), 7); err != nil {
			t.Error(err)
		}
		syncStream(t, writer)
	})
	if err := waiter.WaitValue(word.DevicePtr(), 7); err != nil {
		t.Fatal(err)
	}
	if err := waiter.Memset(buf, 0, 1<<20, 0xAB); err != nil {
		t.Fatal(err)
	}
	ended, err := waiter.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer ended.Close()
	time.Sleep(50 * time.Millisecond)
	if done, err := ended.Query(); err != nil || done {
		t.Fatalf("work behind WaitValue(7) ran before the word was written (done %v, err %v)", done, err)
	}
	if err := writer.WriteValue(word.DevicePtr(), 6); err != nil {
		t.Fatal(err)
	}
	syncStream(t, writer)
	time.Sleep(20 * time.Millisecond)
	if done, err := ended.Query(); err != nil || done {
		t.Fatalf("work behind WaitValue(7) ran once the word was 6 (done %v, err %v)", done, err)
	}
	if err := writer.WriteValue(word.DevicePtr(), 7); err != nil {
		t.Fatal(err)
	}
	syncStream(t, waiter)
	got := make([]byte, 1<<20)
	if err := waiter.CopyDtoH(got, buf, 0); err != nil {
		t.Fatal(err)
	}
	syncStream(t, waiter)
	for i, b := range got {
		if b != 0xAB {
			t.Fatalf("byte %d is %#x after the wait ended, want 0xab", i, b)
		}
	}
}

// TestCUDARaiseWait64 checks the 64-bit word of turns on the GPU: work
// behind WaitValue64 waits while raises leave the word below the value,
// a raise to a smaller value after a larger one changes nothing, and the
// work runs once a raise reaches the value.
func TestCUDARaiseWait64(t *testing.T) {
	d := testDevice(t)
	if !d.StreamMemOps64() {
		t.Skipf("%s does not run 64-bit stream memory operations", d.Name())
	}
	waiter, raiser := testStream(t, d), testStream(t, d)
	word := alloc(t, d, 8)
	buf := alloc(t, d, 1<<20)
	for _, s := range []*Stream{waiter, raiser} {
		if err := s.Memset(word, 0, 8, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.Memset(buf, 0, 1<<20, 0); err != nil {
			t.Fatal(err)
		}
		syncStream(t, s)
	}
	w := word.DevicePtr()
	const want = 3<<32 | 2
	t.Cleanup(func() { // if the test failed before the waiter was let go
		if err := raiser.WriteValue64(w, want); err != nil {
			t.Error(err)
		}
		syncStream(t, raiser)
	})
	if err := waiter.WaitValue64(w, want); err != nil {
		t.Fatal(err)
	}
	if err := waiter.Memset(buf, 0, 1<<20, 0xAB); err != nil {
		t.Fatal(err)
	}
	ended, err := waiter.Record()
	if err != nil {
		t.Fatal(err)
	}
	defer ended.Close()
	for _, v := range []uint64{3<<32 | 1, 2<<32 | 0xffffffff, 5} { // all below
		if err := raiser.RaiseValue64(w, v); err != nil {
			t.Fatal(err)
		}
	}
	syncStream(t, raiser)
	time.Sleep(50 * time.Millisecond)
	if done, err := ended.Query(); err != nil || done {
		t.Fatalf("work behind WaitValue64(%#x) ran before a raise reached it (done %v, err %v)", uint64(want), done, err)
	}
	if got := readWord(t, raiser, word); got != 3<<32|1 {
		t.Fatalf("raises to 3<<32|1, then lower values, left %#x", got)
	}
	if err := raiser.RaiseValue64(w, want); err != nil {
		t.Fatal(err)
	}
	syncStream(t, waiter)
	got := make([]byte, 1<<20)
	if err := waiter.CopyDtoH(got, buf, 0); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if b != 0xAB {
			t.Fatalf("byte %d is %#x after the wait ended, want 0xab", i, b)
		}
	}
}

// readWord returns the 64-bit word at the start of buf.
func readWord(t *testing.T, s *Stream, buf mem.Buffer) uint64 {
	t.Helper()
	b := make([]byte, 8)
	if err := s.CopyDtoH(b, buf, 0); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint64(b)
}

// turnsEnv makes TestGatherLayoutTurnsChild run, as one of the child
// processes of BenchmarkGatherLayoutTurns: its settings, space-separated
// key=value pairs.
const turnsEnv = "WEIGHTCAST_GPU_TURNS"

// BenchmarkGatherLayoutTurns measures what processes that share a GPU
// without MPS lose when the GPU's time slicing interleaves their kernels,
// and what they keep when they take turns instead. It starts receivers=N
// child processes (this binary, TestGatherLayoutTurnsChild), each of which
// maps BenchmarkGatherLayoutModel's 8 GiB model of 300 tensors from this
// process through CUDA IPC, as colocated receivers map the sender's
// tensors, and copies and sums it bucket by bucket (1 GiB, 256 MiB or
// 4 GiB, the next queued before the last is waited for, as the load stage
// does) into tensors of its own, five times. With turns=free the
// processes' kernels compete for the GPU as the demo's receivers do; with
// turns=chain each waits on the GPU (Stream.WaitValue on a word of memory
// mapped from this process) for the process before it to finish the same
// bucket, so that only one process has a kernel ready at any time. The
// rate is every process's bytes over the time from their common start to
// the last one's end (the timer is stopped: only the GB/s it reports mean
// anything); against one process alone, it is what the hand-overs between
// processes cost
// (docs/benchmarks.md, "What the GPU's hand-over between processes
// costs").
func BenchmarkGatherLayoutTurns(b *testing.B) {
	d := testDevice(b)
	const count = 300
	const each = (int64(8<<30) / count) &^ 511
	model := alloc(b, d, int(each)*count)
	s := testStream(b, d)
	if err := s.Memset(model, 0, int(each)*count, 0x5A); err != nil {
		b.Fatal(err)
	}
	syncStream(b, s)
	modelHandle, err := d.ExportIPC(model)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 2, 3} {
		for _, bucket := range []int64{1 << 30, 256 << 20, 4 << 30} {
			for _, turns := range []string{"free", "chain"} {
				if n == 1 && turns == "chain" {
					continue
				}
				b.Run(fmt.Sprintf("receivers=%d/bucket=%dMiB/turns=%s", n, bucket>>20, turns), func(b *testing.B) {
					b.StopTimer()
					const rounds = 5
					var took time.Duration
					for range b.N {
						flags := alloc(b, d, 64*n)
						if err := s.Memset(flags, 0, 64*n, 0); err != nil {
							b.Fatal(err)
						}
						syncStream(b, s)
						flagsHandle, err := d.ExportIPC(flags)
						if err != nil {
							b.Fatal(err)
						}
						settings := fmt.Sprintf("model=%s flags=%s n=%d each=%d count=%d bucket=%d turns=%s rounds=%d",
							modelHandle, flagsHandle, n, each, count, bucket, turns, rounds)
						took += runTurns(b, settings, n)
					}
					b.ReportMetric(float64(b.N*n*rounds)*float64(each*count)/took.Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// runTurns starts n children with settings, each told its rank, waits for
// every one to be ready, starts them together and returns how long they
// took from then to the last one's end.
func runTurns(b *testing.B, settings string, n int) time.Duration {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	type child struct {
		cmd   *exec.Cmd
		goes  *os.File // the child's standard input: "go", then closed
		lines *bufio.Scanner
	}
	var kids []child
	defer func() { // also after a Fatal: no child outlives the benchmark
		for _, k := range kids {
			k.goes.Close() // the child ends
			for k.lines.Scan() {
			}
			if err := k.cmd.Wait(); err != nil {
				b.Errorf("a child of the benchmark: %v", err)
			}
		}
	}()
	for r := range n {
		cmd := exec.Command(exe, "-test.run=^TestGatherLayoutTurnsChild$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s r=%d", turnsEnv, settings, r))
		cmd.Stderr = os.Stderr
		in, goes, err := os.Pipe()
		if err != nil {
			b.Fatal(err)
		}
		cmd.Stdin = in
		stdout, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		in.Close()
		if err != nil {
			goes.Close()
			b.Fatal(err)
		}
		kids = append(kids, child{cmd: cmd, goes: goes, lines: bufio.NewScanner(stdout)})
	}
	waitFor := func(k child, word string) {
		for k.lines.Scan() {
			if strings.HasPrefix(k.lines.Text(), word) {
				return
			}
		}
		b.Fatalf("a child ended before it said %q", word)
	}
	for _, k := range kids {
		waitFor(k, "ready")
	}
	start := time.Now()
	for _, k := range kids {
		fmt.Fprintln(k.goes, "go")
	}
	var wg sync.WaitGroup
	for _, k := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k.lines.Scan() {
				if k.lines.Text() == "done" {
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// TestGatherLayoutTurnsChild is one child process of
// BenchmarkGatherLayoutTurns. It skips unless run by the benchmark.
func TestGatherLayoutTurnsChild(t *testing.T) {
	settings := os.Getenv(turnsEnv)
	if settings == "" {
		t.Skip("runs only as a child process of BenchmarkGatherLayoutTurns")
	}
	kv := map[string]string{}
	for _, f := range strings.Fields(settings) {
		k, v, _ := strings.Cut(f, "=")
		kv[k] = v
	}
	num := func(k string) int64 {
		v, err := strconv.ParseInt(kv[k], 10, 64)
		if err != nil {
			t.Fatalf("setting %s: %v", k, err)
		}
		return v
	}
	n, r, each, count, bucket, rounds := num("n"), num("r"), num("each"), num("count"), num("bucket"), num("rounds")
	chain := kv["turns"] == "chain"
	d := testDevice(t)
	s := testStream(t, d)
	open := func(k string, size int) mem.Buffer {
		h, err := ParseIPCHandle(kv[k])
		if err != nil {
			t.Fatal(err)
		}
		buf, err := d.OpenIPC(h, size)
		if err != nil {
			t.Fatal(err)
		}
		closeAtEnd(t, buf.Free)
		return buf
	}
	src := open("model", int(each*count)).DevicePtr()
	flags := open("flags", int(64*n)).DevicePtr()
	dsts := make([]uint64, count)
	for i := range dsts {
		dsts[i] = alloc(t, d, int(each)).DevicePtr()
	}
	g, cs := testGatherLayout(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	model := each * count
	var l Layout
	var seq uint32
	if chain {
		// Nothing bounds the other processes' waits for this one's word:
		// at the end, failed or not, it is written far ahead of any
		// bucket, from a stream of its own (s may be stuck in a wait),
		// before the mappings close.
		release := testStream(t, d)
		t.Cleanup(func() {
			if err := release.WriteValue(flags+uint64(64*r), seq+1<<30); err != nil {
				t.Error(err)
			}
			syncStream(t, release)
		})
	}
	var last *PendingSum // the bucket before, waited for once the next is queued
	wait := func() {
		if last == nil {
			return
		}
		_, err := last.Wait(ctx)
		last.Close()
		last = nil
		if err != nil {
			t.Fatal(err)
		}
	}
	run := func() {
		for done := int64(0); done < model; done += bucket {
			l.Reset()
			size := min(bucket, model-done)
			for at := int64(0); at < size; {
				pos := done + at
				i, in := pos/each, pos%each
				k := min(each-in, size-at)
				l.Add(at, src+uint64(pos), k, dsts[i]+uint64(in))
				at += k
			}
			seq++
			if chain {
				// This bucket waits for the process before to finish it;
				// the first process waits for the last to finish the one
				// before.
				prev, want := (r+n-1)%n, seq
				if r == 0 {
					want = seq - 1
				}
				if err := s.WaitValue(flags+uint64(64*prev), want); err != nil {
					t.Fatal(err)
				}
			}
			p, err := g.CopySumLayout(ctx, &l, size, cs)
			if err != nil {
				t.Fatal(err)
			}
			if chain {
				if err := s.WriteValue(flags+uint64(64*r), seq); err != nil {
					t.Fatal(err)
				}
			}
			wait()
			last = p
		}
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		t.Fatal("the benchmark closed its pipe before saying go")
	}
	for range rounds {
		run()
	}
	wait()
	fmt.Println("done")
	in.Scan() // until the benchmark closes the pipe
}
