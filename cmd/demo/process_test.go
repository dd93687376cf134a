package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/quant"
	"github.com/weightcast/weightcast/rendezvous/embedetcd"
	"github.com/weightcast/weightcast/rendezvous/rendezvoustest"
	"github.com/weightcast/weightcast/safetensors"
	"github.com/weightcast/weightcast/source"
	"github.com/weightcast/weightcast/timeline"
)

// These tests run the demo as real processes on loopback, one per rank,
// meeting through an etcd started by the test.

var demoBin string

// demoBinEnv names a prebuilt demo binary for these tests to run instead of
// building one, where there is no Go toolchain (a GPU test machine: the
// ranks then pick a GPU transport as the demo's --transport auto does).
const demoBinEnv = "WEIGHTCAST_DEMO_BIN"

func TestMain(m *testing.M) {
	if os.Getenv(serveEtcdEnv) != "" {
		os.Exit(serveEtcd()) // a child process of TestEtcdKilled
	}
	if addr := os.Getenv(relayEnv); addr != "" {
		os.Exit(relayedRank(addr)) // a rank of TestRelayForgesBucket
	}
	dir, err := os.MkdirTemp("", "demo-test-")
	if err != nil {
		panic(err)
	}
	demoBin = filepath.Join(dir, "demo")
	if bin := os.Getenv(demoBinEnv); bin != "" {
		demoBin = bin // a machine without Go: a GPU test host
	} else if out, err := exec.Command("go", "build", "-o", demoBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the demo: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func startEtcd(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	emb, err := embedetcd.Start(ctx, embedetcd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { emb.Close() })
	return "etcd://" + strings.TrimPrefix(emb.ClientURL(), "http://")
}

// rankProc is one rank process.
type rankProc struct {
	rank   int
	cmd    *exec.Cmd
	out    bytes.Buffer
	err    bytes.Buffer
	done   chan struct{}
	exit   error
	exited time.Time
}

// model flags shared by a run's ranks: small and quick unless overridden.
var small = []string{"--size", "4MiB", "--tensors", "30", "--bucket", "256KiB", "--timeout", "20s"}

func startRank(t *testing.T, etcd, group, run string, rank, world int, args ...string) *rankProc {
	t.Helper()
	return startRankOf(t, demoBin, nil, etcd, group, run, rank, world, args...)
}

// startRankOf is startRank running bin, with env added to the environment.
func startRankOf(t *testing.T, bin string, env []string, etcd, group, run string, rank, world int, args ...string) *rankProc {
	t.Helper()
	full := append([]string{"--rank", strconv.Itoa(rank), "--world-size", strconv.Itoa(world), "--rendezvous", etcd,
		"--group", group, "--run-id", run, "--json"}, args...)
	p := &rankProc{rank: rank, cmd: exec.Command(bin, full...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
	p.cmd.Env = append(append(os.Environ(), "NCCL_NVLS_ENABLE=0"), env...)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exit = p.cmd.Wait(); p.exited = time.Now(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

func (p *rankProc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case <-p.done:
		return p.exit
	case <-time.After(d):
		p.cmd.Process.Kill() // so that its output is complete and ours to read
		<-p.done
		t.Fatalf("rank %d still running after %v; stderr:\n%s", p.rank, d, p.err.String())
		return nil
	}
}

func (p *rankProc) summary(t *testing.T) summary {
	t.Helper()
	var s summary
	if err := json.Unmarshal(p.out.Bytes(), &s); err != nil {
		t.Fatalf("rank %d: bad JSON summary (%v): %s\nstderr: %s", p.rank, err, p.out.String(), p.err.String())
	}
	return s
}

func startAll(t *testing.T, etcd, group, run string, world int, args ...string) []*rankProc {
	ps := make([]*rankProc, world)
	for r := range world {
		ps[r] = startRank(t, etcd, group, run, r, world, args...)
	}
	return ps
}

// TestFourRanksByteIdentical: 4 processes, several rounds, every receiver
// verifies every byte.
func TestFourRanksByteIdentical(t *testing.T) {
	etcd := startEtcd(t)
	ps := startAll(t, etcd, "four", "r1", 4, append(small, "--rounds", "4")...)
	for _, p := range ps {
		if err := p.wait(t, 60*time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", p.rank, err, p.err.String())
		}
		s := p.summary(t)
		r := s.PerRank[0]
		if len(r.Rounds) != 4 || r.Error != "" || r.MaxBuffers > 2 {
			t.Fatalf("rank %d: %+v", p.rank, r)
		}
		// Host buckets are verified as every round arrives; a model on a
		// GPU (where the ranks pick ipc or nccl) is read back after the
		// last round.
		want := 4 * s.Bytes
		if r.VerifyScope != "every round" {
			want = s.Bytes
		}
		if p.rank > 0 && (!r.Verified || r.Checked != want) {
			t.Fatalf("rank %d verified %d of %d bytes (%s)", p.rank, r.Checked, want, r.VerifyScope)
		}
	}
}

// TestFourRanksExternalEtcd runs the same over a separate etcd server
// (Debian's etcd-server when installed), as ranks on several hosts would.
func TestFourRanksExternalEtcd(t *testing.T) {
	etcd := "etcd://" + strings.TrimPrefix(rendezvoustest.ExternalEtcd(t)[0], "http://")
	ps := startAll(t, etcd, "four-ext", "r1", 4, append(small, "--rounds", "2")...)
	for _, p := range ps {
		if err := p.wait(t, 60*time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", p.rank, err, p.err.String())
		}
		if r := p.summary(t).PerRank[0]; len(r.Rounds) != 2 || (p.rank > 0 && !r.Verified) {
			t.Fatalf("rank %d: %+v", p.rank, r)
		}
	}
}

// TestManyRounds: 200 rounds in a row; the receivers check every bucket's
// sequence number, so a lost, duplicated or reordered message fails them.
func TestManyRounds(t *testing.T) {
	etcd := startEtcd(t)
	ps := startAll(t, etcd, "many", "r1", 3, "--size", "256KiB", "--tensors", "13", "--bucket", "64KiB", "--rounds", "200", "--timeout", "20s")
	for _, p := range ps {
		if err := p.wait(t, 120*time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", p.rank, err, p.err.String())
		}
		if r := p.summary(t).PerRank[0]; len(r.Rounds) != 200 || (p.rank > 0 && !r.Verified) {
			t.Fatalf("rank %d: %d rounds, verified %v", p.rank, len(r.Rounds), r.Verified)
		}
	}
}

// TestKill9 kills one rank with SIGKILL in the middle of the rounds: every
// other rank exits non-zero within 30 s with an error naming the lost rank.
func TestKill9(t *testing.T) { signalRank(t, "kill", syscall.SIGKILL, "SIGKILL") }

// signalRank sends sig (called name) to rank 2, then to rank 0, of a
// group of 4 streaming rounds, each in a run of its own: every other rank
// must exit non-zero within 30 s with an error naming the signalled rank,
// and say what its model holds (checkCommitted). The test's cleanup kills
// every process, stopped ones included.
func signalRank(t *testing.T, group string, sig syscall.Signal, name string) {
	for _, victim := range []int{2, 0} {
		t.Run(fmt.Sprintf("rank%d", victim), func(t *testing.T) {
			etcd := startEtcd(t)
			ps := startAll(t, etcd, group, "r1", 4, "--size", "64MiB", "--tensors", "30", "--bucket", "4MiB", "--rounds", "1000", "--timeout", "60s")
			time.Sleep(3 * time.Second) // joined and streaming
			for _, p := range ps {
				select {
				case <-p.done:
					t.Fatalf("rank %d ended before the %s: %v\n%s", p.rank, name, p.exit, p.err.String())
				default:
				}
			}
			sent := time.Now()
			if err := ps[victim].cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			for _, p := range ps {
				if p.rank == victim {
					continue
				}
				if err := p.wait(t, 30*time.Second); err == nil {
					t.Fatalf("rank %d exited 0 after rank %d got %s", p.rank, victim, name)
				}
				msg := p.err.String() + p.out.String()
				if !strings.Contains(msg, fmt.Sprintf("rank %d", victim)) {
					// The error alone, first: the whole summary is long
					// enough for a CI log to cut the part that matters.
					t.Errorf("rank %d's error does not name rank %d: %q\nstderr: %s\nsummary: %s",
						p.rank, victim, p.summary(t).PerRank[0].Error, p.err.String(), p.out.String())
				}
				t.Logf("rank %d exited %.1fs after the %s: %s", p.rank, p.exited.Sub(sent).Seconds(), name, p.summary(t).PerRank[0].Error)
			}
			checkCommitted(t, ps, victim)
		})
	}
}

// checkCommitted reads the summaries of the ranks that outlived victim:
// each receiver says what its model holds, and no receiver is more than
// one version ahead of the root's last acknowledged commit nor behind it.
func checkCommitted(t *testing.T, ps []*rankProc, victim int) {
	t.Helper()
	var root *rankResult
	if victim != 0 {
		root = ps[0].summary(t).PerRank[0]
	}
	for _, p := range ps[1:] {
		if p.rank == victim {
			continue
		}
		sum := p.summary(t)
		r := sum.PerRank[0]
		if r.State != "intact" && r.State != "partial (resync needed)" {
			t.Errorf("rank %d does not say what its model holds: state %q", p.rank, r.State)
		}
		if root != nil && (r.CommittedVersion < root.CommittedVersion || r.CommittedVersion > root.CommittedVersion+1) {
			t.Errorf("rank %d reports version %d committed, the root %d", p.rank, r.CommittedVersion, root.CommittedVersion)
		}
		t.Logf("rank %d (%s transport): committed version %d, model %s", p.rank, sum.Transport, r.CommittedVersion, r.State)
	}
}

// TestLateRoot: rank 0 starts 10 s after the others, who wait for it.
func TestLateRoot(t *testing.T) {
	etcd := startEtcd(t)
	var ps []*rankProc
	for r := 1; r < 3; r++ {
		ps = append(ps, startRank(t, etcd, "late", "r1", r, 3, small...))
	}
	time.Sleep(10 * time.Second)
	ps = append(ps, startRank(t, etcd, "late", "r1", 0, 3, small...))
	for _, p := range ps {
		if err := p.wait(t, 60*time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", p.rank, err, p.err.String())
		}
	}
}

// TestMissingRank: a rank that never comes makes the others time out with
// an error naming it.
func TestMissingRank(t *testing.T) {
	etcd := startEtcd(t)
	args := []string{"--size", "1MiB", "--tensors", "10", "--bucket", "64KiB", "--timeout", "3s"}
	ps := []*rankProc{startRank(t, etcd, "missing", "r1", 0, 3, args...), startRank(t, etcd, "missing", "r1", 1, 3, args...)}
	for _, p := range ps {
		if err := p.wait(t, 30*time.Second); err == nil {
			t.Fatalf("rank %d succeeded without rank 2", p.rank)
		}
		if msg := p.err.String() + p.out.String(); !strings.Contains(msg, "rank 2") || !strings.Contains(msg, "timed out") && !strings.Contains(msg, "never") {
			t.Errorf("rank %d's error does not say rank 2 never came:\n%s", p.rank, msg)
		}
	}
}

// TestWorldSizeMismatch: a rank with another world size gets a clear error.
func TestWorldSizeMismatch(t *testing.T) {
	etcd := startEtcd(t)
	args := []string{"--size", "1MiB", "--tensors", "10", "--bucket", "64KiB", "--timeout", "10s"}
	a := startRank(t, etcd, "ws", "r1", 0, 2, args...)
	b := startRank(t, etcd, "ws", "r1", 1, 3, args...)
	for _, p := range []*rankProc{a, b} {
		if err := p.wait(t, 30*time.Second); err == nil {
			t.Fatalf("rank %d succeeded with mismatched world sizes", p.rank)
		}
		if msg := p.err.String() + p.out.String(); !strings.Contains(msg, "world size") {
			t.Errorf("rank %d's error does not mention the world size:\n%s", p.rank, msg)
		}
	}
}

// TestGroupInUse: a second run on a group whose first run is alive is
// refused; once the first run is killed, a new run on that group succeeds
// within the lease time.
func TestGroupInUse(t *testing.T) {
	etcd := startEtcd(t)
	first := startAll(t, etcd, "busy", "first", 2, "--size", "16MiB", "--tensors", "30", "--bucket", "1MiB", "--rounds", "100000", "--timeout", "60s")
	time.Sleep(2 * time.Second)
	second := startRank(t, etcd, "busy", "second", 0, 2, "--size", "1MiB", "--tensors", "10", "--bucket", "64KiB", "--timeout", "10s")
	if err := second.wait(t, 30*time.Second); err == nil {
		t.Fatal("a second run took a group held by a live run")
	}
	if msg := second.err.String() + second.out.String(); !strings.Contains(msg, "first") || !strings.Contains(msg, "in use") {
		t.Errorf("the refusal does not say the group is in use by run first:\n%s", msg)
	}
	var wg sync.WaitGroup
	for _, p := range first {
		wg.Go(func() { p.cmd.Process.Signal(syscall.SIGKILL); <-p.done })
	}
	wg.Wait()
	start := time.Now()
	third := startAll(t, etcd, "busy", "third", 2, "--size", "1MiB", "--tensors", "10", "--bucket", "64KiB", "--timeout", "40s")
	for _, p := range third {
		if err := p.wait(t, 60*time.Second); err != nil {
			t.Fatalf("new run, rank %d: %v\n%s", p.rank, err, p.err.String())
		}
	}
	t.Logf("the new run finished %.1fs after the old one was killed", time.Since(start).Seconds())
}

// TestTorchrunEnvironment starts ranks as torchrun would: RANK, WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT, with rank 0 serving the rendezvous itself,
// and torchrun's default TORCHELASTIC_RUN_ID=none: no run id is needed, rank
// 0 names the run on the rendezvous it serves. Each rank's summary speaks
// for itself only.
func TestTorchrunEnvironment(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port // handed to rank 0 as torchrun hands out MASTER_PORT
	l.Close()
	var ps []*rankProc
	for r := range 3 {
		p := &rankProc{rank: r, cmd: exec.Command(demoBin, append([]string{"--json"}, small...)...), done: make(chan struct{})}
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
		p.cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE=3", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "TORCHELASTIC_RUN_ID=none")
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.exit = p.cmd.Wait(); close(p.done) }()
		t.Cleanup(func() { p.cmd.Process.Kill(); <-p.done })
		ps = append(ps, p)
	}
	for _, p := range ps {
		if err := p.wait(t, 60*time.Second); err != nil {
			t.Fatalf("rank %d: %v\n%s", p.rank, err, p.err.String())
		}
		s := p.summary(t)
		if r := s.PerRank[0]; r.Rank != p.rank || (p.rank > 0 && !r.Verified) {
			t.Fatalf("rank %d: %+v", p.rank, r)
		}
		if s.Scope != "this rank" || s.Verified != (p.rank > 0) {
			t.Errorf("rank %d: summary scope %q, verified %v; want this rank, verified only on a receiver", p.rank, s.Scope, s.Verified)
		}
	}
}

// TestTraceAndTimeline: a local launch with --trace and --timeline writes a
// trace that is valid Chrome trace-event JSON with spans from every rank,
// and an SVG.
func TestTraceAndTimeline(t *testing.T) {
	dir := t.TempDir()
	trace, svg := filepath.Join(dir, "trace.json"), filepath.Join(dir, "timeline.svg")
	cmd := exec.Command(demoBin, append([]string{"--ranks", "3", "--rounds", "2", "--trace", trace, "--timeline", svg}, small...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	f, err := os.Open(trace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := timeline.Validate(f); err != nil {
		t.Fatal(err)
	}
	f.Seek(0, 0)
	tr, err := timeline.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Processes) != 3 {
		t.Fatalf("trace has %d ranks, want 3", len(tr.Processes))
	}
	b, err := os.ReadFile(svg)
	if err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Fatalf("timeline: %v, %d bytes", err, len(b))
	}
}

// TestCheckpointRoundTrip syncs a sharded Hugging Face checkpoint (written by
// the Python reference implementation) to two receivers, which write it back
// with --out: every file comes out byte-identical. With --dtype bf16 the
// output is a valid checkpoint whose floating tensors are BF16.
func TestCheckpointRoundTrip(t *testing.T) {
	src := "../../safetensors/testdata/reference/sharded_transformers"
	out := t.TempDir()
	cmd := exec.Command(demoBin, "--ranks", "3", "--rounds", "2", "--bucket", "4KiB", "--model", src, "--out", out, "--json")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	files, _ := filepath.Glob(filepath.Join(src, "*"))
	if len(files) < 2 {
		t.Fatalf("fixture has %d files", len(files))
	}
	for r := 1; r <= 2; r++ {
		for _, f := range files {
			want, _ := os.ReadFile(f)
			got, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("rank%d", r), filepath.Base(f)))
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("rank %d: %s differs from the source (%v)", r, filepath.Base(f), err)
			}
		}
	}

	cast := t.TempDir()
	cmd = exec.Command(demoBin, "--ranks", "2", "--rounds", "1", "--bucket", "4KiB", "--model", "../../safetensors/testdata/reference/mixed.safetensors", "--dtype", "bf16", "--out", cast)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	m, err := safetensors.OpenModel(filepath.Join(cast, "rank1"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	floats := 0
	for _, ti := range m.Tensors() {
		switch ti.DType {
		case dtype.F32, dtype.F16:
			t.Errorf("tensor %s is still %s after --dtype bf16", ti.Name, ti.DType)
		case dtype.BF16:
			floats++
		}
	}
	if floats == 0 {
		t.Fatal("no BF16 tensor in the cast output")
	}
}

// TestQuantizeRound runs a local launch with --quantize fp8-block: every
// receiver verifies the FP8 codes and scales against its own quantization
// of the model, and writes a checkpoint whose picked weights are F8_E4M3
// with F32 scales, which dequantize to within the FP8 rounding bound of
// the synthetic model's last round, and no config.json (the synthetic
// model has none).
func TestQuantizeRound(t *testing.T) {
	out := t.TempDir()
	args := append([]string{"--ranks", "3", "--rounds", "2", "--quantize", "fp8-block", "--out", out, "--json"}, small...)
	cmd := exec.Command(demoBin, args...)
	cmd.Env = append(os.Environ(), "CUDA_VISIBLE_DEVICES=")
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	var s summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	for _, r := range s.PerRank {
		if r.Error != "" || (r.Rank > 0 && (!r.Verified || r.Checked == 0)) {
			t.Fatalf("rank %d: %+v", r.Rank, r)
		}
	}
	orig, err := source.Synthetic{Size: 4 << 20, Tensors: 30, DTypes: []dtype.DType{dtype.BF16}, Seed: 1 + 2}.Model()
	if err != nil {
		t.Fatal(err)
	}
	m, err := safetensors.OpenModel(filepath.Join(out, "rank2"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	quantized := 0
	for _, w := range orig.List() {
		ti, ok := m.Tensor(w.Name)
		if !ok {
			t.Fatalf("%s not written", w.Name)
		}
		if !quant.Default(w.Name, w.DType, w.Shape) {
			if ti.DType != w.DType {
				t.Fatalf("%s is %s, want it as it was (%s)", w.Name, ti.DType, w.DType)
			}
			continue
		}
		quantized++
		si, ok := m.Tensor(w.Name + quant.ScaleSuffix)
		if ti.DType != dtype.F8E4M3 || !ok || si.DType != dtype.F32 {
			t.Fatalf("%s: %s, scales %v %v", w.Name, ti.DType, ok, si.DType)
		}
		rows, cols := int(w.Shape[0]), int(w.Shape[1])
		codes, scales := readAll(t, m, w.Name), readAll(t, m, w.Name+quant.ScaleSuffix)
		sc := make([]uint32, len(scales)/4)
		for i := range sc {
			sc[i] = binary.LittleEndian.Uint32(scales[4*i:])
		}
		deq := make([]byte, 4*rows*cols)
		if err := quant.Dequantize(deq, dtype.F32, codes, sc, rows, cols); err != nil {
			t.Fatal(err)
		}
		src := make([]byte, 2*rows*cols)
		if err := w.ReadAt(src, 0); err != nil {
			t.Fatal(err)
		}
		nbc := (cols + 127) / 128
		for i := range rows * cols {
			o := float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16))
			d := float64(math.Float32frombits(binary.LittleEndian.Uint32(deq[4*i:])))
			s := float64(math.Float32frombits(sc[(i/cols/128)*nbc+(i%cols)/128]))
			// Half a step of E4M3's 3-bit mantissa at the value, or of
			// its subnormal step, times the block's scale.
			bound := math.Max(math.Abs(o)/16, 0x1p-10*s) + math.Abs(o)*0x1p-20
			if math.Abs(d-o) > bound {
				t.Fatalf("%s element %d: %g came back as %g", w.Name, i, o, d)
			}
		}
	}
	if quantized == 0 {
		t.Fatal("no weight was quantized")
	}
	if _, err := os.Stat(filepath.Join(out, "rank2", "config.json")); !os.IsNotExist(err) {
		t.Fatalf("a config.json for the synthetic model, which has none (%v)", err)
	}
}

// readAll returns the bytes of a tensor of an open checkpoint.
func readAll(t *testing.T, m *safetensors.Model, name string) []byte {
	t.Helper()
	ti, _ := m.Tensor(name)
	b := make([]byte, ti.Size)
	if err := m.ReadTensor(name, b); err != nil {
		t.Fatal(err)
	}
	return b
}
