//go:build !cgo

package gpu

import (
	"errors"
	"strings"
	"testing"
)

// TestNoCgo checks what a program built without cgo sees: every entry
// point fails with an error that matches both ErrNoCgo and ErrNoDriver (so
// callers that skip without a GPU skip here too) and says how to rebuild.
func TestNoCgo(t *testing.T) {
	err := OpenCUDA()
	if !errors.Is(err, ErrNoCgo) || !errors.Is(err, ErrNoDriver) {
		t.Fatalf("OpenCUDA: %v, want an error matching ErrNoCgo and ErrNoDriver", err)
	}
	for _, s := range []string{DriverLibrary, "CGO_ENABLED=0", "CGO_ENABLED=1"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
	if _, err := NewCUDADevice(0); !errors.Is(err, ErrNoCgo) {
		t.Errorf("NewCUDADevice: %v, want ErrNoCgo", err)
	}
	if _, err := DeviceCount(); !errors.Is(err, ErrNoCgo) {
		t.Errorf("DeviceCount: %v, want ErrNoCgo", err)
	}
	if _, err := driverVersion(); !errors.Is(err, ErrMissingSymbol) {
		t.Errorf("a driver call: %v, want ErrMissingSymbol, as with no driver loaded", err)
	}
}
