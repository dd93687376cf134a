package nccl

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/weightcast/weightcast/gpu"
)

// LibraryEnv names the environment variable that points at the libnccl.so.2
// to load, overriding the search.
const LibraryEnv = "WEIGHTCAST_NCCL_LIBRARY"

// DefaultLibrary is the name handed to the dynamic loader's own search.
const DefaultLibrary = "libnccl.so.2"

// wheelLib is where the nvidia-nccl-cu* Python wheels put the library,
// under a site-packages (or dist-packages) directory.
const wheelLib = "nvidia/nccl/lib/libnccl.so.2"

// ErrNoLibrary is matched (errors.Is) by the error of every entry point when
// no NCCL library could be loaded. In a program built without cgo the error
// also matches gpu.ErrNoCgo.
var ErrNoLibrary = errors.New("nccl: no NCCL library")

// Options says which NCCL library Load opens.
type Options struct {
	// Library is the path of the libnccl.so.2 to load. Empty means: the
	// WEIGHTCAST_NCCL_LIBRARY variable if set, else the dynamic loader's
	// search for libnccl.so.2, else a Python wheel's copy
	// (site-packages/nvidia/nccl/lib/libnccl.so.2) found under VIRTUAL_ENV,
	// CONDA_PREFIX, the python3 on PATH, /opt/*/.venv, /usr/local and
	// ~/.local. An explicit path (option or variable) is the only one tried.
	Library string
}

var (
	loadMu     sync.Mutex
	loadedPath string // the file loaded; "" until a Load succeeds
)

// Load opens NCCL once per process; later calls return nil, or an error
// when they name a different library than the one already loaded (two NCCL
// libraries cannot share a process). Every other entry point calls Load with
// zero Options when nothing is loaded yet.
//
// Load sets NCCL_NVLS_ENABLE=0 in this process's environment, whatever it
// was, before NCCL reads it: NVLink multicast (NVLS) can take a shared
// host's GPUs out of service, and this package never enables it. Processes
// that callers start should get SafeEnv's environment for the same reason.
func Load(opts Options) error {
	loadMu.Lock()
	defer loadMu.Unlock()
	if err := os.Setenv("NCCL_NVLS_ENABLE", "0"); err != nil {
		return fmt.Errorf("nccl: setting NCCL_NVLS_ENABLE=0: %w", err)
	}
	cands := candidates(opts, os.Getenv, exec.LookPath)
	if loadedPath != "" {
		if explicit := cands[0]; explicit.explicit && !sameFile(explicit.path, loadedPath) {
			return fmt.Errorf("nccl: %s is already loaded; cannot also load %s (from %s) in this process",
				loadedPath, explicit.path, explicit.from)
		}
		return nil
	}
	path, err := loadFirst(cands)
	if err != nil {
		return err
	}
	loadedPath = path
	return nil
}

func ensureLoaded() error {
	loadMu.Lock()
	loaded := loadedPath != ""
	loadMu.Unlock()
	if loaded {
		return nil
	}
	return Load(Options{})
}

// LoadedPath returns the file of the loaded NCCL library, or "" before a
// successful Load.
func LoadedPath() string {
	loadMu.Lock()
	defer loadMu.Unlock()
	return loadedPath
}

// VersionCode is NCCL's version number, NCCL_VERSION(major, minor, patch):
// 22803 for 2.28.3 (1000*major + 100*minor + patch before 2.9).
type VersionCode int

// Parts returns major, minor and patch.
func (v VersionCode) Parts() (major, minor, patch int) {
	if v < 10000 {
		return int(v) / 1000, int(v) % 1000 / 100, int(v) % 100
	}
	return int(v) / 10000, int(v) % 10000 / 100, int(v) % 100
}

// String returns "2.28.3".
func (v VersionCode) String() string {
	a, b, c := v.Parts()
	return fmt.Sprintf("%d.%d.%d", a, b, c)
}

// Version loads NCCL if needed and returns its version.
func Version() (VersionCode, error) {
	if err := ensureLoaded(); err != nil {
		return 0, err
	}
	return version()
}

func version() (VersionCode, error) {
	v, r := ncclGetVersion()
	if r != Success {
		return 0, &Error{Op: "get version", Rank: -1, Result: r}
	}
	return VersionCode(v), nil
}

// SafeEnv returns a copy of env (os.Environ() when nil) with
// NCCL_NVLS_ENABLE=0, replacing any other setting: give it to every process
// that may load NCCL.
func SafeEnv(env []string) []string {
	if env == nil {
		env = os.Environ()
	}
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "NCCL_NVLS_ENABLE=") {
			out = append(out, kv)
		}
	}
	return append(out, "NCCL_NVLS_ENABLE=0")
}

type candidate struct {
	path     string
	from     string // why this path is tried, for error messages
	explicit bool   // named by the caller: the only candidate
}

// candidates lists the libraries Load tries, in order.
func candidates(opts Options, getenv func(string) string, lookPath func(string) (string, error)) []candidate {
	if opts.Library != "" {
		return []candidate{{path: opts.Library, from: "Options.Library", explicit: true}}
	}
	if p := getenv(LibraryEnv); p != "" {
		return []candidate{{path: p, from: LibraryEnv, explicit: true}}
	}
	out := []candidate{{path: DefaultLibrary, from: "the dynamic loader's search path"}}
	seen := map[string]bool{}
	addPrefix := func(prefix, from string) {
		if prefix == "" {
			return
		}
		for _, pat := range []string{
			"lib/python3*/site-packages/" + wheelLib,
			"lib/python3*/dist-packages/" + wheelLib,
			"local/lib/python3*/dist-packages/" + wheelLib,
		} {
			matches, _ := filepath.Glob(filepath.Join(prefix, pat))
			for _, m := range matches {
				if !seen[m] {
					seen[m] = true
					out = append(out, candidate{path: m, from: from})
				}
			}
		}
	}
	addPrefix(getenv("VIRTUAL_ENV"), "VIRTUAL_ENV")
	addPrefix(getenv("CONDA_PREFIX"), "CONDA_PREFIX")
	for _, py := range []string{"python3", "python"} {
		if p, err := lookPath(py); err == nil {
			// bin/python3 -> the environment's prefix; venvs link their
			// python to the base interpreter, so do not resolve links.
			addPrefix(filepath.Dir(filepath.Dir(p)), "the "+py+" on PATH")
		}
	}
	for _, glob := range []string{"/opt/*/.venv", "/opt/*/venv", "/opt/conda", "/usr/local", "/usr"} {
		prefixes, _ := filepath.Glob(glob)
		for _, p := range prefixes {
			addPrefix(p, p)
		}
	}
	if home := getenv("HOME"); home != "" {
		addPrefix(filepath.Join(home, ".local"), "~/.local")
	}
	return out
}

// loadFirst loads the first candidate that opens as an NCCL library and
// returns the file loaded. It changes nothing when all fail.
func loadFirst(cands []candidate) (string, error) {
	var tried []string
	for _, c := range cands {
		loaded, err := openLibrary(c.path)
		if err == nil {
			return loaded, nil
		}
		if errors.Is(err, gpu.ErrNoCgo) {
			return "", fmt.Errorf("%w: cannot load %s: %w", ErrNoLibrary, c.path, err)
		}
		tried = append(tried, fmt.Sprintf("%s (from %s): %v", c.path, c.from, err))
	}
	hint := "install NCCL (libnccl2, or pip install nvidia-nccl-cu12) or set " + LibraryEnv + " to the path of libnccl.so.2"
	if len(cands) == 1 && cands[0].explicit {
		hint = "point " + cands[0].from + " at an existing libnccl.so.2"
	}
	return "", fmt.Errorf("%w: tried %s; %s", ErrNoLibrary, strings.Join(tried, "; "), hint)
}

func sameFile(a, b string) bool {
	ra, errA := filepath.EvalSymlinks(a)
	rb, errB := filepath.EvalSymlinks(b)
	if errA != nil || errB != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return ra == rb
}
