//go:build !cgo

package dl

import (
	"errors"
	"testing"
)

// TestNoCgo checks what a program built without cgo sees: Open fails with
// an error matching both ErrNoLibrary and ErrNoCgo, whose text says how to
// rebuild.
func TestNoCgo(t *testing.T) {
	l, err := Open("libc.so.6")
	if l != nil || !errors.Is(err, ErrNoLibrary) || !errors.Is(err, ErrNoCgo) {
		t.Fatalf("Open = %v, %v; want an error matching ErrNoLibrary and ErrNoCgo", l, err)
	}
	if err.Error() != ErrNoCgo.Error() {
		t.Errorf("error %q, want ErrNoCgo's text", err)
	}
}
