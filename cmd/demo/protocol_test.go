package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/rendezvous/rendezvoustest"
	"github.com/weightcast/weightcast/safetensors"
	"github.com/weightcast/weightcast/source"
)

// python is the interpreter the Python tests run: $PYTHON, or Debian's,
// which has python3-zmq and python3-numpy.
func python(t *testing.T) string {
	t.Helper()
	py := os.Getenv("PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if out, err := exec.Command(py, "-c", "import zmq").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import zmq (Debian: apt install python3-zmq): %v %s", py, err, out)
	}
	return py
}

// TestIndependentReceiver runs docs/receiver.py, a receiver written from
// docs/protocol.md alone (etcd through its JSON gateway, the bus on pyzmq,
// the tcp chain on sockets), as rank 2 of a 4-rank tcp run of the demo:
// in the middle of the chain, so it forwards every chunk and relays the
// acknowledgements. Every rank ends at the root's end of the run, and
// each version the Python rank commits is the one the root sent, byte for
// byte.
func TestIndependentReceiver(t *testing.T) {
	py := python(t)
	etcd := rendezvoustest.ExternalEtcd(t)[0] // serves the JSON gateway
	const world, rounds, pyRank = 4, 3, 2
	size, tensors := int64(6<<20), 4 // tensors larger than a bucket, buckets of several chunks
	args := []string{"--transport", "tcp", "--size", fmt.Sprint(size), "--tensors", fmt.Sprint(tensors), "--dtypes", "bf16,f32,i8",
		"--bucket", "1MiB", "--rounds", fmt.Sprint(rounds), "--timeout", "60s"}
	group, run := "indep", "r1"
	var ps []*rankProc
	for r := range world {
		if r != pyRank {
			ps = append(ps, startRank(t, "etcd://"+strings.TrimPrefix(etcd, "http://"), group, run, r, world, args...))
		}
	}
	out := t.TempDir()
	cmd := exec.Command(py, "../../docs/receiver.py", "--etcd", etcd, "--group", group, "--run-id", run,
		"--rank", fmt.Sprint(pyRank), "--world-size", fmt.Sprint(world), "--out", out, "--timeout", "60")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	var pyErr error
	select {
	case pyErr = <-done:
		done <- pyErr // for the cleanup
	case <-time.After(90 * time.Second):
		t.Fatalf("the Python receiver still runs after 90s:\n%s\n%s", stdout.String(), stderr.String())
	}
	for _, p := range ps {
		if err := p.wait(t, 30*time.Second); err != nil {
			t.Errorf("rank %d: %v\n%s", p.rank, err, p.err.String())
		}
	}
	if pyErr != nil {
		t.Fatalf("the Python receiver: %v\nstdout:\n%s\nstderr:\n%s", pyErr, stdout.String(), stderr.String())
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("the Python receiver said:\n%s", stdout.String())
	if lines := strings.Split(strings.TrimSpace(stdout.String()), "\n"); lines[0] != "joined" || lines[len(lines)-1] != "end" || len(lines) != rounds+2 {
		t.Fatalf("the Python receiver said:\n%s", stdout.String())
	}
	for _, p := range ps {
		if r := p.summary(t).PerRank[0]; r.CommittedVersion != rounds {
			t.Errorf("rank %d committed version %d, want %d", p.rank, r.CommittedVersion, rounds)
		}
	}

	// Each version as the demo's root made it: the synthetic model of
	// seed 1 + version (--seed 1, the default).
	for v := 1; v <= rounds; v++ {
		want, err := source.Synthetic{Size: size, Tensors: tensors, DTypes: []dtype.DType{dtype.BF16, dtype.F32, dtype.I8}, Seed: 1 + uint64(v)}.Model()
		if err != nil {
			t.Fatal(err)
		}
		f, err := safetensors.Open(filepath.Join(out, fmt.Sprintf("version-%d.safetensors", v)))
		if err != nil {
			t.Fatalf("version %d: %v", v, err)
		}
		got := f.Tensors()
		if len(got) != len(want.List()) {
			t.Fatalf("version %d: %d tensors, the root sent %d", v, len(got), len(want.List()))
		}
		for _, wt := range want.List() {
			gt, ok := f.Tensor(wt.Name)
			if !ok || gt.DType != wt.DType || !slices.Equal(gt.Shape, wt.Shape) {
				t.Fatalf("version %d: tensor %s is %+v, the root sent %s%v", v, wt.Name, gt, wt.DType, wt.Shape)
			}
			n, _ := wt.Size()
			a, b := make([]byte, n), make([]byte, n)
			if err := wt.ReadAt(a, 0); err != nil {
				t.Fatal(err)
			}
			if _, err := f.ReadAt(b, gt.Offset); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(a, b) {
				t.Fatalf("version %d: tensor %s differs from what the root sent", v, wt.Name)
			}
		}
		f.Close()
	}
}
