package gputest

import (
	"context"
	_ "embed"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weightcast/weightcast/gpu"
)

// The stand-ins for libcuda.so.1 and libnccl.so.2 that RunWithFakes builds:
// "device" memory is host memory and copies are memcpy, and each refuses
// what a careless binding might pass (a handle it did not make, a call
// without the context current, a changed unique id, a config of another
// layout). The files say what they check.
var (
	//go:embed testdata/fakecuda.c
	fakeCUDA string
	//go:embed testdata/fakenccl.c
	fakeNCCL string
)

// fakesEnv tells a test binary that RunWithFakes started it.
const fakesEnv = "WEIGHTCAST_GPUTEST_FAKES"

// RunWithFakes runs the test named child, of the calling package, in a
// child process of the test binary that loads the stand-ins for
// libcuda.so.1 and libnccl.so.2 (compiled from testdata with the host's C
// compiler, $CC or cc) instead of the real libraries, and fails t unless the
// child passed. It checks the cgo layer of packages gpu and nccl on
// machines without a GPU. It skips t where there is no C compiler, and in a
// build without cgo, which cannot load libraries.
func RunWithFakes(t *testing.T, child string) {
	t.Helper()
	if err := gpu.OpenCUDA(); errors.Is(err, gpu.ErrNoCgo) {
		t.Skipf("skipping: needs a cgo build: %v", err)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("skipping: needs a C compiler to build the stand-in libraries: %v", err)
	}
	dir := t.TempDir()
	for _, lib := range []struct{ name, src string }{{"libcuda.so.1", fakeCUDA}, {"libnccl.so.2", fakeNCCL}} {
		src := filepath.Join(dir, lib.name+".c")
		if err := os.WriteFile(src, []byte(lib.src), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(cc, "-shared", "-fPIC", "-o", filepath.Join(dir, lib.name), src).CombinedOutput(); err != nil {
			t.Fatalf("building the stand-in %s: %v\n%s", lib.name, err, out)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^"+child+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), fakesEnv+"="+dir,
		"LD_LIBRARY_PATH="+dir+string(filepath.ListSeparator)+os.Getenv("LD_LIBRARY_PATH"),
		"WEIGHTCAST_NCCL_LIBRARY="+filepath.Join(dir, "libnccl.so.2"))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+child) {
		t.Fatalf("%s with the stand-in libraries: %v\n%s", child, err, out)
	}
}

// InFakeChild skips tb unless it runs in the child process of
// RunWithFakes.
func InFakeChild(tb testing.TB) {
	tb.Helper()
	if os.Getenv(fakesEnv) == "" {
		tb.Skip("runs only in the child process of RunWithFakes")
	}
}
