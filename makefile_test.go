package weightcast

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMakeTestRunsPytestAfterGoFails runs the Makefile's test target, in a
// copy of its own, with a go and a python that only say they ran and fail
// when told to: the Python tests must run even when a Go package fails, and
// the target must fail whenever either did.
func TestMakeTestRunsPytestAfterGoFails(t *testing.T) {
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("skipping: needs make")
	}
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("Makefile", string(mk), 0o644)
	write("capi/weightcast.h", "", 0o644)
	write("python/weightcast/__init__.py", "", 0o644)
	// The fake go fails `go test -race` (the race-detector run of every
	// package) when FAIL_GO is set, and succeeds at everything else.
	write("bin/go", "#!/bin/sh\necho \"go $*\"\nif [ \"$1\" = test ] && [ \"$2\" = -race ] && [ -n \"$FAIL_GO\" ]; then exit 1; fi\n", 0o755)
	write("bin/python", "#!/bin/sh\necho \"python-tests-ran $*\"\nif [ -n \"$FAIL_PY\" ]; then exit 3; fi\n", 0o755)

	for _, tc := range []struct {
		failGo, failPy, wantFail bool
	}{
		{false, false, false},
		{true, false, true},
		{false, true, true},
		{true, true, true},
	} {
		cmd := exec.Command(makeBin, "-s", "test", "GO="+filepath.Join(dir, "bin/go"), "PYTHON="+filepath.Join(dir, "bin/python"))
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "MAKEFLAGS=", "MAKELEVEL=")
		if tc.failGo {
			cmd.Env = append(cmd.Env, "FAIL_GO=1")
		}
		if tc.failPy {
			cmd.Env = append(cmd.Env, "FAIL_PY=1")
		}
		out, err := cmd.CombinedOutput()
		if !strings.Contains(string(out), "python-tests-ran") {
			t.Errorf("go fails %v, pytest fails %v: the Python tests did not run:\n%s", tc.failGo, tc.failPy, out)
		}
		if failed := err != nil; failed != tc.wantFail {
			t.Errorf("go fails %v, pytest fails %v: make test failed = %v (%v), want %v:\n%s", tc.failGo, tc.failPy, failed, err, tc.wantFail, out)
		}
	}
}
