//go:build !cgo

package nccl

import (
	"errors"
	"strings"
	"testing"

	"github.com/weightcast/weightcast/gpu"
)

// TestNoCgo checks what a program built without cgo sees: Load and every
// entry point fail with an error that matches both ErrNoLibrary (so
// callers that skip without NCCL skip here too) and gpu.ErrNoCgo, names
// the library and says how to rebuild.
func TestNoCgo(t *testing.T) {
	err := Load(Options{})
	if !errors.Is(err, ErrNoLibrary) || !errors.Is(err, gpu.ErrNoCgo) {
		t.Fatalf("Load: %v, want an error matching ErrNoLibrary and gpu.ErrNoCgo", err)
	}
	for _, s := range []string{DefaultLibrary, "CGO_ENABLED=1"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if _, err := NewUniqueID(); !errors.Is(err, gpu.ErrNoCgo) {
		t.Errorf("NewUniqueID: %v, want gpu.ErrNoCgo", err)
	}
	if _, err := Version(); !errors.Is(err, ErrNoLibrary) {
		t.Errorf("Version: %v, want ErrNoLibrary", err)
	}
	if LoadedPath() != "" {
		t.Errorf("LoadedPath() = %q after a failed Load", LoadedPath())
	}
}
