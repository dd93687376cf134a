//go:build cgo

package dl

import (
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// libm.so.6 and libc.so.6 are on every glibc Linux, and cos is in libm.

func TestOpenAndSymbol(t *testing.T) {
	l, err := Open("libm.so.6")
	if err != nil {
		t.Fatalf("Open(libm.so.6): %v", err)
	}
	defer l.Close()
	if l.Name() != "libm.so.6" {
		t.Errorf("Name() = %q", l.Name())
	}
	if p := l.Path(); !filepath.IsAbs(p) || !strings.Contains(filepath.Base(p), "libm") {
		t.Errorf("Path() = %q, want the absolute path the loader found libm at", p)
	}
	p, err := l.Symbol("cos")
	if err != nil || p == nil {
		t.Fatalf("Symbol(cos) = %v, %v", p, err)
	}
	if f := l.Func("cos"); f == nil {
		t.Error("Func(cos) = nil")
	}
}

func TestMissingSymbol(t *testing.T) {
	l, err := Open("libc.so.6")
	if err != nil {
		t.Fatalf("Open(libc.so.6): %v", err)
	}
	defer l.Close()
	const name = "weightcast_no_such_symbol"
	p, err := l.Symbol(name)
	var e *Error
	if p != nil || !errors.Is(err, ErrNoSymbol) || errors.Is(err, ErrNoLibrary) || !errors.As(err, &e) {
		t.Fatalf("Symbol(%s) = %v, %v; want nil and an *Error matching ErrNoSymbol only", name, p, err)
	}
	if e.Symbol != name || e.Name != "libc.so.6" || !strings.Contains(err.Error(), name) {
		t.Errorf("error %+v (%q) does not name the symbol and the library", e, err)
	}
	if f := l.Func(name); f != nil {
		t.Errorf("Func(%s) = %p, want nil", name, f)
	}
}

func TestMissingLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libweightcast-missing.so")
	l, err := Open(missing)
	var e *Error
	if l != nil || !errors.Is(err, ErrNoLibrary) || errors.Is(err, ErrNoSymbol) || errors.Is(err, ErrNoCgo) ||
		!errors.As(err, &e) {
		t.Fatalf("Open(%s) = %v, %v; want an *Error matching ErrNoLibrary only", missing, l, err)
	}
	// The text is the loader's own, which names the file and why.
	if !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "No such file") {
		t.Errorf("error %q does not say which file is missing", err)
	}
	if _, err := Open(); !errors.Is(err, ErrNoLibrary) {
		t.Errorf("Open() = %v, want ErrNoLibrary", err)
	}
}

// TestSearchList checks that Open takes the first name that opens, and
// reports every name, in order, when none does.
func TestSearchList(t *testing.T) {
	dir := t.TempDir()
	first, second := filepath.Join(dir, "a.so"), filepath.Join(dir, "b.so")
	l, err := Open(first, "libm.so.6", "libc.so.6")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Name() != "libm.so.6" {
		t.Errorf("opened %q, want libm.so.6, the first name that opens", l.Name())
	}
	_, err = Open(first, second)
	if !errors.Is(err, ErrNoLibrary) {
		t.Fatalf("Open of two missing files: %v", err)
	}
	msg := err.Error()
	if i, j := strings.Index(msg, first), strings.Index(msg, second); i < 0 || j < i {
		t.Errorf("error %q does not name %s then %s", msg, first, second)
	}
}

func TestClose(t *testing.T) {
	l, err := Open("libm.so.6")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v, want nil (idempotent)", err)
	}
	if _, err := l.Symbol("cos"); !errors.Is(err, ErrNoSymbol) || !strings.Contains(err.Error(), "closed") {
		t.Errorf("Symbol after Close: %v, want ErrNoSymbol saying it is closed", err)
	}
}

// TestConcurrentUse looks up symbols from many goroutines at once, so
// that the race detector sees the handle shared.
func TestConcurrentUse(t *testing.T) {
	l, err := Open("libm.so.6")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if _, err := l.Symbol("sin"); err != nil {
					t.Error(err)
					return
				}
				if _, err := l.Symbol("weightcast_no_such_symbol"); !errors.Is(err, ErrNoSymbol) {
					t.Errorf("missing symbol: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestFill(t *testing.T) {
	l, err := Open("libm.so.6")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// A dispatch table as cgo shows a C struct of function pointers.
	var table struct {
		cos                       *[0]byte
		n                         int // not a function pointer: left alone
		weightcast_no_such_symbol *[0]byte
		sin                       *[0]byte
	}
	table.n = 7
	table.weightcast_no_such_symbol = new([0]byte) // overwritten with nil
	missing := Fill(l, &table)
	if table.cos == nil || table.sin == nil || table.n != 7 || table.weightcast_no_such_symbol != nil {
		t.Fatalf("Fill left %+v", table)
	}
	if len(missing) != 1 || missing[0] != "weightcast_no_such_symbol" {
		t.Errorf("Fill reported %v missing, want [weightcast_no_such_symbol]", missing)
	}
	if p, _ := l.Symbol("cos"); unsafe.Pointer(table.cos) != p {
		t.Errorf("table.cos = %p, Symbol(cos) = %p", table.cos, p)
	}
	defer func() {
		if recover() == nil {
			t.Error("Fill of a non-struct did not panic")
		}
	}()
	var x int
	Fill(l, &x)
}
