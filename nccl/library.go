package nccl

// The library layer. Every call into NCCL goes through one small Go
// function named after the NCCL call (ncclGetVersion, ncclBroadcast, ...)
// that takes and returns Go types. library_cgo.go, the package's only cgo
// file, implements them over the C dispatch table of nccl_shim.h.
// library_nocgo.go implements them for programs built without cgo: there
// no library can be loaded, so openLibrary fails with gpu.ErrNoCgo and
// every other call answers functionNotFound, exactly what the C shims
// answer before a library is loaded. The rest of the package is pure Go.
// A new NCCL call takes a field named after its symbol in the table
// (nccl_shim.h; openLibrary's dl.Fill looks every field up by its name), a
// shim, a Go function in library_cgo.go and its twin in library_nocgo.go.

// uniqueIDBytes is the size of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
const uniqueIDBytes = 128

// commSlot is the address of the C memory that holds a communicator's
// ncclComm_t: NCCL writes the handle there during init, and the memory
// stays put for the communicator's life (newCommSlot, free). Go never
// dereferences it; 0 means none.
type commSlot uintptr
