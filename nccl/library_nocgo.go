//go:build !cgo

package nccl

import "github.com/weightcast/weightcast/gpu"

// The library layer of a program built without cgo (see library.go): no
// library can be loaded, and every call answers what the C shims answer
// before a library is loaded, functionNotFound. The signatures are
// library_cgo.go's; `CGO_ENABLED=0 go build` checks that they still match.

func openLibrary(string) (loaded string, err error) { return "", gpu.ErrNoCgo }

func ncclGetVersion() (int, Result)    { return 0, functionNotFound }
func ncclGetUniqueId(*UniqueID) Result { return functionNotFound }
func ncclGetLastError() string         { return "" }

func newCommSlot() commSlot    { return 0 }
func (commSlot) free()         {}
func (commSlot) created() bool { return false }

func ncclCommInitRankConfig(commSlot, int, *UniqueID, int) Result { return functionNotFound }
func ncclCommGetAsyncError(commSlot) (state, r Result)            { return Success, functionNotFound }
func ncclCommFinalize(commSlot) Result                            { return functionNotFound }
func ncclCommDestroy(commSlot) Result                             { return functionNotFound }
func ncclCommAbort(commSlot) Result                               { return functionNotFound }

func ncclBroadcast(uint64, uint64, int, int, commSlot, uintptr) Result { return functionNotFound }
