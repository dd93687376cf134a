package dl

import (
	"errors"
	"reflect"
	"strings"
	"sync/atomic"
	"unsafe"
)

// ErrNoLibrary is matched (errors.Is) by the error of Open when none of
// the names it was given opens.
var ErrNoLibrary = errors.New("dl: library cannot be opened")

// ErrNoSymbol is matched (errors.Is) by the error of Symbol when the
// library does not export the symbol.
var ErrNoSymbol = errors.New("dl: symbol not found")

// ErrNoCgo is matched (errors.Is) by the error of Open in a program built
// without cgo, where no library can be loaded; that error also matches
// ErrNoLibrary. Packages gpu and nccl hand it on as gpu.ErrNoCgo.
var ErrNoCgo = errors.New("weightcast was built without cgo (CGO_ENABLED=0); rebuild with a C compiler and CGO_ENABLED=1 to use GPUs")

// Error is the error of Open and Symbol. Its text is what the dynamic
// loader said (dlerror), which names the file or the symbol; errors.Is
// matches ErrNoLibrary (Open) or ErrNoSymbol (Symbol), and ErrNoCgo where
// that is the reason.
type Error struct {
	// Name is the library's name or path as given to Open (for several,
	// joined by ", ").
	Name string
	// Symbol is the symbol that was not found; "" for Open.
	Symbol string
	// Msg is the loader's message (for several names, one per name in
	// order, joined by "; ").
	Msg string

	kind  error // ErrNoLibrary or ErrNoSymbol
	cause error // ErrNoCgo, or nil
}

// Error returns the loader's message.
func (e *Error) Error() string { return e.Msg }

// Unwrap returns the sentinels the error matches.
func (e *Error) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// Library is a shared library opened by Open. Its methods may be called
// from any goroutine.
type Library struct {
	name   string
	path   string
	handle atomic.Uintptr // the dlopen handle; 0 once closed
}

// Open opens the first of names that the dynamic loader opens (RTLD_NOW,
// RTLD_LOCAL), each a file name for the loader's own search
// ("libcuda.so.1") or a path: names is the search list, in order. When
// none opens, the error is an *Error matching ErrNoLibrary with the
// loader's message for each name.
func Open(names ...string) (*Library, error) {
	msgs := make([]string, 0, len(names))
	for _, name := range names {
		h, msg, err := open(name)
		if err != nil {
			return nil, &Error{Name: name, Msg: err.Error(), kind: ErrNoLibrary, cause: err}
		}
		if h != 0 {
			l := &Library{name: name, path: path(h)}
			if l.path == "" {
				l.path = name
			}
			l.handle.Store(h)
			return l, nil
		}
		msgs = append(msgs, msg)
	}
	if len(names) == 0 {
		msgs = append(msgs, "dl: Open was given no library name")
	}
	return nil, &Error{Name: strings.Join(names, ", "), Msg: strings.Join(msgs, "; "), kind: ErrNoLibrary}
}

// Name returns the name or path the library was opened by.
func (l *Library) Name() string { return l.name }

// Path returns the file the loader opened (for a name the loader searched
// for, where it found it).
func (l *Library) Path() string { return l.path }

// Symbol returns the address of the symbol name in the library (or in the
// libraries it depends on, as dlsym searches). The error is an *Error
// matching ErrNoSymbol when there is none, or the library was closed; the
// address is C memory, never Go's.
func (l *Library) Symbol(name string) (unsafe.Pointer, error) {
	h := l.handle.Load()
	if h == 0 {
		return nil, &Error{Name: l.name, Symbol: name, Msg: l.name + " is closed", kind: ErrNoSymbol}
	}
	p, msg := symbol(h, name)
	if p == nil {
		return nil, &Error{Name: l.name, Symbol: name, Msg: msg, kind: ErrNoSymbol}
	}
	return p, nil
}

// Func returns the address of the function name as cgo types a C function
// pointer (*[0]byte), so that a package's cgo code can store it in its
// dispatch table; nil when the library lacks it (the table's shims answer
// "function not found" then).
func (l *Library) Func(name string) *[0]byte {
	p, err := l.Symbol(name)
	if err != nil {
		return nil
	}
	return (*[0]byte)(p)
}

// Close closes the library. The addresses it returned must not be used
// afterwards. Close is idempotent; its error is the loader's.
func (l *Library) Close() error {
	h := l.handle.Swap(0)
	if h == 0 {
		return nil
	}
	if msg := closeLib(h); msg != "" {
		return errors.New(msg)
	}
	return nil
}

// Fill fills a dispatch table: every field of *table whose type is a C
// function pointer as cgo types it (*[0]byte) gets the address of the
// function of the field's name (Func), nil where the library lacks it.
// Fields of other types are left alone. It returns the names of the
// functions not found. So a table declared in C, one field per function
// and named after it, is its own list of symbols: no list of names is
// kept beside it. table must point to a struct.
func Fill[T any](l *Library, table *T) (missing []string) {
	v := reflect.ValueOf(table).Elem()
	if v.Kind() != reflect.Struct {
		panic("dl.Fill: table must point to a struct, not " + v.Type().String())
	}
	fnType := reflect.TypeFor[*[0]byte]()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type != fnType {
			continue
		}
		fn := l.Func(f.Name)
		if fn == nil {
			missing = append(missing, f.Name)
		}
		// The fields of a cgo struct are unexported, so reflect cannot
		// set them; write through the field's address instead.
		*(**[0]byte)(unsafe.Add(unsafe.Pointer(table), f.Offset)) = fn
	}
	return missing
}
