package nccl

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/gpu"
)

// These tests need no GPU and no NCCL: they run everywhere.

func TestResultNames(t *testing.T) {
	want := []string{"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
		"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclTimeout"}
	for i, n := range want {
		r := Result(i)
		if r.Name() != n {
			t.Errorf("Result(%d).Name() = %q, want %q", i, r.Name(), n)
		}
		if !strings.HasPrefix(r.Error(), n+" (") {
			t.Errorf("Result(%d).Error() = %q", i, r.Error())
		}
	}
	if got := Result(42).Name(); got != "ncclResult(42)" {
		t.Errorf("unknown code named %q", got)
	}
	if !errors.Is(functionNotFound, ErrNoLibrary) || errors.Is(InternalError, ErrNoLibrary) {
		t.Error("only a missing function matches ErrNoLibrary")
	}
}

func TestErrorMessage(t *testing.T) {
	e := &Error{Op: "broadcast", Label: "weights", Rank: 2, NRanks: 4, Result: RemoteError,
		Detail: "peer closed the connection", Aborted: true}
	msg := e.Error()
	for _, s := range []string{"nccl broadcast", `comm "weights"`, "rank 2 of 4", "ncclRemoteError", "peer closed", "aborted"} {
		if !strings.Contains(msg, s) {
			t.Errorf("%q lacks %q", msg, s)
		}
	}
	if !errors.Is(e, RemoteError) {
		t.Error("Error does not unwrap to its Result")
	}
	e = &Error{Op: "init", Rank: 0, NRanks: 2, Err: context.DeadlineExceeded, Aborted: true}
	if !errors.Is(e, context.DeadlineExceeded) || errors.Is(e, Success) {
		t.Errorf("init timeout unwraps wrong: %v", e)
	}
	if !strings.Contains(e.Error(), "peer rank may be missing") {
		t.Errorf("timeout message gives no hint: %q", e)
	}
}

func TestVersionCode(t *testing.T) {
	for v, s := range map[VersionCode]string{22803: "2.28.3", 22809: "2.28.9", 21903: "2.19.3", 2708: "2.7.8"} {
		if v.String() != s {
			t.Errorf("VersionCode(%d) = %q, want %q", int(v), v.String(), s)
		}
	}
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("not a library"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCandidates(t *testing.T) {
	tmp := t.TempDir()
	venv := filepath.Join(tmp, "venv")
	venvLib := filepath.Join(venv, "lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2")
	touch(t, venvLib)
	pyPrefix := filepath.Join(tmp, "py")
	pyLib := filepath.Join(pyPrefix, "lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2")
	touch(t, pyLib)
	env := map[string]string{"VIRTUAL_ENV": venv}
	getenv := func(k string) string { return env[k] }
	lookPath := func(name string) (string, error) {
		if name == "python3" {
			return filepath.Join(pyPrefix, "bin/python3"), nil
		}
		return "", errors.New("not found")
	}
	paths := func(cs []candidate) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.path)
		}
		return out
	}

	got := paths(candidates(Options{}, getenv, lookPath))
	if len(got) < 3 || got[0] != DefaultLibrary || got[1] != venvLib || got[2] != pyLib {
		t.Fatalf("search order = %v, want [%s %s %s ...]", got, DefaultLibrary, venvLib, pyLib)
	}
	if slices.Index(got[1:], venvLib) != 0 {
		t.Fatalf("%s listed twice: %v", venvLib, got)
	}

	env[LibraryEnv] = "/x/libnccl.so.2"
	if cs := candidates(Options{}, getenv, lookPath); len(cs) != 1 || cs[0].path != "/x/libnccl.so.2" || !cs[0].explicit {
		t.Fatalf("with %s set: %+v", LibraryEnv, cs)
	}
	if cs := candidates(Options{Library: "/y/libnccl.so.2"}, getenv, lookPath); len(cs) != 1 || cs[0].path != "/y/libnccl.so.2" {
		t.Fatalf("with Options.Library set: %+v", cs)
	}
}

func TestLoadFailures(t *testing.T) {
	if _, err := openLibrary("libc.so.6"); errors.Is(err, gpu.ErrNoCgo) {
		t.Skipf("skipping: needs the dynamic loader: %v", err)
	}
	tmp := t.TempDir()
	text := filepath.Join(tmp, "libnccl.so.2")
	touch(t, text)
	cases := []struct {
		path, want string
	}{
		{filepath.Join(tmp, "missing/libnccl.so.2"), "No such file"},
		{text, text},
		{"libc.so.6", "not an NCCL library"},
	}
	for _, c := range cases {
		_, err := loadFirst([]candidate{{path: c.path, from: LibraryEnv, explicit: true}})
		if !errors.Is(err, ErrNoLibrary) {
			t.Errorf("loading %s: %v, want ErrNoLibrary", c.path, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, c.want) || !strings.Contains(msg, LibraryEnv) {
			t.Errorf("loading %s: %q lacks %q or the variable's name", c.path, msg, c.want)
		}
	}
}

func TestLoadTurnsNVLSOff(t *testing.T) {
	t.Setenv("NCCL_NVLS_ENABLE", "1")
	if err := Load(Options{Library: filepath.Join(t.TempDir(), "libnccl.so.2")}); err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
	if v := os.Getenv("NCCL_NVLS_ENABLE"); v != "0" {
		t.Fatalf("NCCL_NVLS_ENABLE = %q after Load, want 0", v)
	}
}

func TestSafeEnv(t *testing.T) {
	got := SafeEnv([]string{"A=1", "NCCL_NVLS_ENABLE=1", "B=2"})
	want := []string{"A=1", "B=2", "NCCL_NVLS_ENABLE=0"}
	if !slices.Equal(got, want) {
		t.Fatalf("SafeEnv = %v, want %v", got, want)
	}
	if env := SafeEnv(nil); env[len(env)-1] != "NCCL_NVLS_ENABLE=0" {
		t.Fatalf("SafeEnv(nil) ends with %q", env[len(env)-1])
	}
}

// TestNoLibrary checks what a machine without NCCL sees.
func TestNoLibrary(t *testing.T) {
	err := Load(Options{})
	if err == nil {
		t.Skipf("NCCL is installed here (%s); nothing to check", LoadedPath())
	}
	if !errors.Is(err, ErrNoLibrary) || !strings.Contains(err.Error(), DefaultLibrary) {
		t.Fatalf("Load: %v", err)
	}
	if _, err := Version(); !errors.Is(err, ErrNoLibrary) {
		t.Errorf("Version: %v, want ErrNoLibrary", err)
	}
	if _, err := NewUniqueID(); !errors.Is(err, ErrNoLibrary) {
		t.Errorf("NewUniqueID: %v, want ErrNoLibrary", err)
	}
	if _, err := version(); !errors.Is(err, ErrNoLibrary) {
		t.Errorf("shim call with an empty table: %v, want ErrNoLibrary", err)
	}
}
