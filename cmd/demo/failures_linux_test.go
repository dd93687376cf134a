package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/weightcast/weightcast/dtype"
	"github.com/weightcast/weightcast/safetensors"
)

// These tests break runs the way users did (issue 12's cases) with real
// rank processes: a checkpoint truncated under a run, an --out that fills
// up or refuses a write, a checkpoint with a huge __metadata__. Each
// asserts how fast every process ends, its status, what it says, and
// the files left behind.

// writeCheckpoint writes a checkpoint of n F32 tensors of size bytes each,
// of random bytes, to path and returns its SHA-256. meta is its
// __metadata__.
func writeCheckpoint(t *testing.T, path string, n int, size int64, meta map[string]string) [32]byte {
	t.Helper()
	var infos []safetensors.TensorInfo
	for i := range n {
		infos = append(infos, safetensors.TensorInfo{Name: fmt.Sprintf("layers.%d.weight", i), DType: dtype.F32, Shape: []int64{size / 4}})
	}
	w, err := safetensors.Create(path, infos, meta, safetensors.WithoutSync(), safetensors.WithLimits(safetensors.Limits{MaxMetadataBytes: 1 << 30}))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.NewChaCha8([32]byte{byte(n), byte(size)})
	buf := make([]byte, 1<<20)
	for _, ti := range infos {
		for off := int64(0); off < size; off += int64(len(buf)) {
			p := buf[:min(int64(len(buf)), size-off)]
			rng.Read(p)
			if err := w.WriteTensorAt(ti.Name, p, off); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// waitFile waits until path exists (a receiver put a round in place).
func waitFile(t *testing.T, path string, d time.Duration, ps []*rankProc) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		for _, p := range ps {
			select {
			case <-p.done:
				t.Fatalf("rank %d exited before %s appeared: %v\n%s", p.rank, path, p.exit, p.err.String())
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within %v", path, d)
		}
		time.Sleep(20 * time.Millisecond) // polls a file; no process to synchronize with
	}
}

// outHolds fails unless dir holds exactly the file name, nothing hidden
// beside it (no round directory, no spool or temporary file), with the
// given SHA-256.
func outHolds(t *testing.T, dir, name string, sum [32]byte) {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{name}) {
		t.Fatalf("%s holds %q, want only %s: a failed round left files behind", dir, names, name)
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(b) != sum {
		t.Fatalf("%s/%s is not the committed version's file", dir, name)
	}
}

// endsSoon waits for every rank and fails unless each failed within
// bound of since, naming want in its error.
func endsSoon(t *testing.T, ps []*rankProc, since time.Time, bound time.Duration, want string) {
	t.Helper()
	for _, p := range ps {
		err := p.wait(t, bound+time.Minute)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitFailed {
			t.Errorf("rank %d: exit %v, want status %d", p.rank, err, exitFailed)
		}
		if d := p.exited.Sub(since); d > bound {
			t.Errorf("rank %d ended %v after the failure, want within %v: %s", p.rank, d.Round(time.Millisecond), bound, p.summary(t).PerRank[0].Error)
		}
		t.Logf("rank %d ended %v after the failure: %s", p.rank, p.exited.Sub(since).Round(time.Millisecond), p.summary(t).PerRank[0].Error)
		if msg := p.summary(t).PerRank[0].Error; !strings.Contains(msg, want) {
			t.Errorf("rank %d's error does not name %q: %s", p.rank, want, msg)
		}
	}
}

// TestTruncatedCheckpoint truncates the checkpoint a 4-rank tcp run reads,
// with buckets of many chunks in flight, once the first round is in place
// on every receiver: the root sees it at once, and every rank ends within
// seconds (not its 60 s timeout) naming the file, each receiver's --out
// holding the committed round, whole, its model intact.
func TestTruncatedCheckpoint(t *testing.T) {
	for _, cut := range []int64{0, 40 << 20} {
		t.Run(fmt.Sprintf("cut to %d", cut), func(t *testing.T) {
			etcd := startEtcd(t)
			dir := t.TempDir()
			model := filepath.Join(dir, "m.safetensors")
			sum := writeCheckpoint(t, model, 4, 16<<20, nil)
			out := t.TempDir()
			ps := startAll(t, etcd, "truncated", "r1", 4, "--transport", "tcp", "--model", model, "--bucket", "16MiB",
				"--rounds", "1000", "--verify=false", "--out", out, "--timeout", "60s")
			waitFile(t, filepath.Join(out, "rank3", "m.safetensors"), time.Minute, ps)
			if err := os.Truncate(model, cut); err != nil {
				t.Fatal(err)
			}
			endsSoon(t, ps, time.Now(), 10*time.Second, model)
			for _, p := range ps[1:] {
				if r := p.summary(t).PerRank[0]; r.State != "intact" || r.CommittedVersion < 1 {
					t.Errorf("rank %d: state %q, committed %d; want intact at version 1 or later", p.rank, r.State, r.CommittedVersion)
				}
				outHolds(t, filepath.Join(out, fmt.Sprintf("rank%d", p.rank)), "m.safetensors", sum)
			}
		})
	}
}

// TestOutWriteFails makes one receiver's --out refuse its writes after the
// first round is in place (a file size limit set on the running process:
// the kernel fails its writes with EFBIG): the round fails on every rank
// within seconds, and every receiver keeps the committed round's file
// alone and says its model is intact.
func TestOutWriteFails(t *testing.T) {
	etcd := startEtcd(t)
	model := filepath.Join(t.TempDir(), "m.safetensors")
	sum := writeCheckpoint(t, model, 2, 4<<20, map[string]string{"format": "pt"})
	out := t.TempDir()
	ps := startAll(t, etcd, "outfails", "r1", 4, "--transport", "tcp", "--model", model, "--bucket", "1MiB",
		"--rounds", "1000", "--out", out, "--timeout", "60s")
	waitFile(t, filepath.Join(out, "rank1", "m.safetensors"), time.Minute, ps)
	limit := unix.Rlimit{Cur: 1 << 20, Max: 1 << 20}
	if err := unix.Prlimit(ps[1].cmd.Process.Pid, unix.RLIMIT_FSIZE, &limit, nil); err != nil {
		t.Skipf("cannot limit rank 1's file size: %v", err)
	}
	endsSoon(t, ps[1:2], time.Now(), 10*time.Second, "file too large")
	for _, p := range ps {
		if p.rank != 1 {
			endsSoon(t, []*rankProc{p}, ps[1].exited, 10*time.Second, "rank 1")
		}
	}
	for _, p := range ps[1:] {
		if r := p.summary(t).PerRank[0]; r.State != "intact" || r.CommittedVersion < 1 {
			t.Errorf("rank %d: state %q, committed %d; want intact at version 1 or later", p.rank, r.State, r.CommittedVersion)
		}
		outHolds(t, filepath.Join(out, fmt.Sprintf("rank%d", p.rank)), "m.safetensors", sum)
	}
}

// TestOutDiskFull runs the demo with --out on a small tmpfs (when this
// test may mount one): three receivers fit one version each and half of
// the next, so the second round fails with ENOSPC. Every receiver keeps
// the first round's file alone and says its model is intact, the file
// system holds nothing else, and the next run into the same directory
// succeeds.
func TestOutDiskFull(t *testing.T) {
	model := filepath.Join(t.TempDir(), "m.safetensors")
	sum := writeCheckpoint(t, model, 2, 2<<20, nil)
	st, err := os.Stat(model)
	if err != nil {
		t.Fatal(err)
	}
	page := int64(os.Getpagesize())
	file := (st.Size() + page - 1) / page * page
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", file*9/2), "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s); the sink's disk-full handling is tested through a file system interface in package stages", err, bytes.TrimSpace(out))
	}
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	used := func() int64 {
		var fs unix.Statfs_t
		if err := unix.Statfs(mnt, &fs); err != nil {
			t.Fatal(err)
		}
		return int64(fs.Blocks-fs.Bfree) * fs.Bsize
	}

	cmd := exec.Command(demoBin, "--ranks", "4", "--transport", "tcp", "--model", model, "--bucket", "1MiB", "--rounds", "2", "--out", mnt, "--json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitFailed || time.Since(start) > time.Minute {
		t.Fatalf("a run with --out on a full disk: %v after %v, want status %d\n%s", err, time.Since(start), exitFailed, stderr.String())
	}
	var s summary
	if err := json.Unmarshal(stdout.Bytes(), &s); err != nil {
		t.Fatalf("summary: %v\n%s", err, stdout.String())
	}
	full := false
	for _, r := range s.PerRank[1:] {
		full = full || strings.Contains(r.Error, "no space left on device")
		if r.State != "intact" || r.CommittedVersion != 1 {
			t.Errorf("rank %d: state %q, committed %d; want intact at version 1 (%s)", r.Rank, r.State, r.CommittedVersion, r.Error)
		}
		outHolds(t, filepath.Join(mnt, fmt.Sprintf("rank%d", r.Rank)), "m.safetensors", sum)
	}
	if !full {
		t.Errorf("no receiver names the full disk:\n%s", stdout.String())
	}
	if u := used(); u > 3*file+64<<10 {
		t.Errorf("the file system holds %d bytes after the failed round; the three committed files take %d", u, 3*file)
	}

	// The next run: one receiver writes into its directory again.
	if out, err := exec.Command(demoBin, "--ranks", "2", "--transport", "tcp", "--model", model, "--bucket", "1MiB", "--rounds", "1", "--out", mnt).CombinedOutput(); err != nil {
		t.Fatalf("the next run: %v\n%s", err, out)
	}
	outHolds(t, filepath.Join(mnt, "rank1"), "m.safetensors", sum)
}

// TestHugeMetadata: a valid checkpoint whose __metadata__ is far over the
// limit is refused before any rank starts, at once, naming the file, the
// metadata's size and the limit.
func TestHugeMetadata(t *testing.T) {
	model := filepath.Join(t.TempDir(), "notes.safetensors")
	writeCheckpoint(t, model, 1, 4096, map[string]string{"notes": strings.Repeat("x", 24<<20)})
	start := time.Now()
	out, err := exec.Command(demoBin, "--ranks", "4", "--model", model).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || time.Since(start) > 10*time.Second {
		t.Fatalf("%v after %v, want status %d at once:\n%s", err, time.Since(start), exitUsage, out)
	}
	for _, want := range []string{model, fmt.Sprintf("__metadata__ is %d bytes", 24<<20+len(`{"notes":""}`)), fmt.Sprintf("limit of %d", safetensors.DefaultMaxMetadataBytes)} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
}
