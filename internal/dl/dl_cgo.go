//go:build cgo

package dl

/*
#cgo LDFLAGS: -ldl
#cgo noescape wc_dl_open
#cgo nocallback wc_dl_open
#cgo noescape wc_dl_sym
#cgo nocallback wc_dl_sym
#cgo noescape wc_dl_path
#cgo nocallback wc_dl_path
#cgo noescape wc_dl_close
#cgo nocallback wc_dl_close
#include <stdlib.h>
#include "dl_shim.h"
*/
import "C"

import "unsafe"

// This is the package's only cgo file: each function below is one call of
// the C helper of dl_shim.h, with Go types on the Go side. dl_nocgo.go has
// the same functions for builds without cgo. No call keeps a Go pointer
// after it returns (the message buffers are written during the call), so
// they are marked noescape and nocallback.

// msgBytes bounds a loader message.
const msgBytes = 1024

// open opens name and returns its handle, or 0 and the loader's message;
// err is for builds that cannot load at all (nil here).
func open(name string) (h uintptr, msg string, err error) {
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	var m [msgBytes]C.char
	if h := uintptr(C.wc_dl_open(n, &m[0], C.size_t(len(m)))); h != 0 {
		return h, "", nil
	}
	return 0, C.GoString(&m[0]), nil
}

// symbol returns the address of name in the library h, or nil and the
// loader's message.
func symbol(h uintptr, name string) (unsafe.Pointer, string) {
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	var m [msgBytes]C.char
	if p := C.wc_dl_sym(C.uintptr_t(h), n, &m[0], C.size_t(len(m))); p != nil {
		return p, ""
	}
	return nil, C.GoString(&m[0])
}

// path returns the file the library h was loaded from, "" where the
// loader does not say.
func path(h uintptr) string {
	var out [4096]C.char
	if C.wc_dl_path(C.uintptr_t(h), &out[0], C.size_t(len(out))) != 0 {
		return ""
	}
	return C.GoString(&out[0])
}

// closeLib closes h and returns "", or the loader's message.
func closeLib(h uintptr) string {
	var m [msgBytes]C.char
	if C.wc_dl_close(C.uintptr_t(h), &m[0], C.size_t(len(m))) != 0 {
		return C.GoString(&m[0])
	}
	return ""
}
