//go:build cgo

package nccl

/*
#cgo noescape wc_ncclGetVersion
#cgo nocallback wc_ncclGetVersion
#cgo noescape wc_ncclGetUniqueId
#cgo nocallback wc_ncclGetUniqueId
#cgo noescape wc_ncclCommInitRankConfig
#cgo nocallback wc_ncclCommInitRankConfig
#cgo noescape wc_ncclCommGetAsyncError
#cgo nocallback wc_ncclCommGetAsyncError
#include <stdlib.h>
#include "nccl_shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/weightcast/weightcast/internal/dl"
)

// This is the package's only cgo file: each function below is one call of
// a C shim of nccl_shim.h, with Go types on the Go side. library_nocgo.go
// has the same functions for builds without cgo; library.go says why.
//
// No shim keeps a Go pointer after it returns, as cgo's rules require:
// out-parameters and the unique id are read or written during the call
// (the communicator's slot, which NCCL writes later, is C memory). So the
// shims that take pointers are marked noescape, and nocallback (none calls
// into Go, and C must not point into a stack that a callback could move):
// their arguments may stay on the Go stack, and a call allocates nothing.

// The C constants and the Go constants they mirror are the same numbers:
// each pair is checked when this file compiles (converting a negative
// constant to uint does not compile).
const (
	_ = uint(int(functionNotFound) - C.WC_NCCL_FUNCTION_NOT_FOUND)
	_ = uint(C.WC_NCCL_FUNCTION_NOT_FOUND - int(functionNotFound))
	_ = uint(uniqueIDBytes - C.WC_NCCL_UNIQUE_ID_BYTES)
	_ = uint(C.WC_NCCL_UNIQUE_ID_BYTES - uniqueIDBytes)
	_ = uint(int(InProgress) - C.WC_ncclInProgress)
	_ = uint(C.WC_ncclInProgress - int(InProgress))
)

// openLibrary opens path and, if it is an NCCL library (it has
// ncclGetVersion), fills the dispatch table, both through package dl, and
// returns the file actually loaded; the table is untouched on an error,
// whose text is the loader's message or says what is not NCCL.
func openLibrary(path string) (loaded string, err error) {
	lib, err := dl.Open(path)
	if err != nil {
		return "", err
	}
	var t C.wc_nccl_table
	dl.Fill(lib, &t) // a missing function answers "not found" when called
	if t.ncclGetVersion == nil {
		lib.Close()
		return "", fmt.Errorf("%s has no ncclGetVersion: not an NCCL library", path)
	}
	C.wc_nccl = t
	return lib.Path(), nil
}

func ncclGetVersion() (int, Result) {
	var v C.int
	r := C.wc_ncclGetVersion(&v)
	return int(v), Result(r)
}

func ncclGetUniqueId(id *UniqueID) Result {
	return Result(C.wc_ncclGetUniqueId((*C.ncclUniqueId)(unsafe.Pointer(&id[0]))))
}

// ncclGetLastError returns NCCL's last error message for the calling
// thread, "" where there is none.
func ncclGetLastError() string {
	s := C.wc_ncclGetLastError(nil)
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

// newCommSlot allocates the C memory of one communicator handle, zeroed.
func newCommSlot() commSlot { return commSlot(C.wc_comm_slot_new()) }

// free frees the slot's memory.
func (s commSlot) free() { C.wc_comm_slot_free(C.uintptr_t(s)) }

// created reports whether NCCL has written a communicator into the slot.
func (s commSlot) created() bool { return C.wc_comm_slot_set(C.uintptr_t(s)) != 0 }

// ncclCommInitRankConfig starts the communicator of rank in a world of
// nranks with a non-blocking config (blocking = 0), writing it into s; the
// C shim passes the 128-byte id by value.
func ncclCommInitRankConfig(s commSlot, nranks int, id *UniqueID, rank int) Result {
	return Result(C.wc_ncclCommInitRankConfig(C.uintptr_t(s), C.int(nranks),
		(*C.ncclUniqueId)(unsafe.Pointer(&id[0])), C.int(rank), 0))
}

// ncclCommGetAsyncError returns the communicator's state, and r the
// result of the call itself.
func ncclCommGetAsyncError(s commSlot) (state, r Result) {
	var st C.ncclResult_t
	r = Result(C.wc_ncclCommGetAsyncError(C.uintptr_t(s), &st))
	return Result(st), r
}

func ncclCommFinalize(s commSlot) Result { return Result(C.wc_ncclCommFinalize(C.uintptr_t(s))) }
func ncclCommDestroy(s commSlot) Result  { return Result(C.wc_ncclCommDestroy(C.uintptr_t(s))) }
func ncclCommAbort(s commSlot) Result    { return Result(C.wc_ncclCommAbort(C.uintptr_t(s))) }

// ncclBroadcast queues a broadcast of count bytes (ncclUint8) from send on
// root to recv on every rank, on the CUstream stream.
func ncclBroadcast(send, recv uint64, count, root int, s commSlot, stream uintptr) Result {
	return Result(C.wc_ncclBroadcast(C.uint64_t(send), C.uint64_t(recv), C.size_t(count), C.int(root),
		C.uintptr_t(s), C.uintptr_t(stream)))
}
