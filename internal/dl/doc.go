// Package dl opens shared libraries at run time and looks up their symbols:
// dlopen, dlsym and dlclose through a small C helper (dl_shim.c), which
// reads dlerror in the same C call as the function that failed, since the
// loader's error is per thread and a goroutine may change threads between
// two cgo calls.
//
// It is the one dynamic-library layer of packages gpu (libcuda.so.1) and
// nccl (libnccl.so.2). Each of them keeps its own dispatch table, a C
// struct of function pointers, and its static inline call shims, which
// answer "function not found" for a NULL pointer; what they share is here:
// opening the first of a list of names that loads (Open), the addresses of
// the table's functions (Symbol, Func), the file the loader chose (Path),
// and the errors: ErrNoLibrary when no name opens, ErrNoSymbol when a
// library lacks a symbol, and ErrNoCgo in a program built without cgo.
//
// dl_cgo.go is the package's only cgo file; dl_nocgo.go stands in for it
// when cgo is off, so the package builds everywhere and Open fails there
// with an error matching both ErrNoLibrary and ErrNoCgo.
package dl
