//go:build cgo

// Command capi is the C interface of weightcast: built with
// `go build -buildmode=c-shared -o libweightcast.so ./capi` it is the
// shared library that C programs link and the Python package loads with
// ctypes. weightcast.h in this directory is its header: the calls, the
// error codes and who owns which memory. Every call goes through the
// library's front door, package weightcast, so the C library and the demo
// run the same rank set-up.
//
// Handles are integers mapped to Go objects in a table; C never holds a Go
// pointer. Every exported function recovers a panic into WC_ERR_PANIC.
// Rounds run on goroutines that the handle owns: wc_send and wc_receive
// start one, wc_wait and wc_next wait for it in slices, and wc_close ends
// and joins it.
//
// A C library needs cgo: with CGO_ENABLED=0 every file of this package is
// left out, so the rest of the module still builds without a C compiler.
package main

func main() {}
