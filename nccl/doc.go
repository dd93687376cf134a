// Package nccl drives NCCL from Go: it loads libnccl.so.2 at run time,
// makes unique ids, creates non-blocking communicators, broadcasts device
// memory and aborts cleanly, so that every wait is bounded by a context.
//
// # Loading
//
// Load (called implicitly by every entry point) looks for the library in
// this order: Options.Library, the WEIGHTCAST_NCCL_LIBRARY variable, the
// dynamic loader's search for libnccl.so.2, then a Python wheel's copy
// (site-packages/nvidia/nccl/lib/libnccl.so.2) under VIRTUAL_ENV,
// CONDA_PREFIX, the python3 on PATH, /opt/*/.venv, /usr/local and ~/.local.
// Where none loads, errors match ErrNoLibrary. One library per process.
//
// The library is reached through a small cgo shim with a hand-written header
// (nccl_shim.h): a dispatch table of function pointers filled by dlsym
// (both through internal/dl, the dynamic-library layer shared with gpu), each
// call going through a static inline function that answers "function not
// found" for a missing symbol. Using NCCL needs a program built with cgo (a
// C compiler) but neither NCCL nor CUDA headers. The 128-byte ncclUniqueId
// is passed by value through a C function that dereferences a pointer, and
// ncclConfig_t follows the NCCL 2.28 layout (NCCL accepts it from 2.28 on).
//
// Every C call sits in one file, library_cgo.go: small Go functions named
// after the NCCL calls, with Go types. Built without cgo (CGO_ENABLED=0),
// the package still compiles, with library_nocgo.go in that file's place:
// every entry point then fails with an error matching both ErrNoLibrary and
// gpu.ErrNoCgo.
//
// # Communicators and waits
//
// NCCL calls cannot be interrupted, so NewComm creates the communicator with
// blocking = 0 and polls ncclCommGetAsyncError; Broadcast queues
// ncclBroadcast on a gpu.Stream and polls an event recorded after it
// together with ncclCommGetAsyncError. Both select on ctx.Done() while they
// poll. When the context ends or NCCL reports an error, the communicator is
// aborted (ncclCommAbort, never ncclCommDestroy on an error path) and the
// returned *Error says so; Close finalizes and destroys it on the clean path.
// Calls that read the current CUDA context run with the device's primary
// context made current on a locked OS thread (gpu.CUDADevice.LockContext).
//
// # Environment
//
// NVLink multicast (NVLS) can take a shared host's GPUs out of service, so
// Load sets NCCL_NVLS_ENABLE=0 in this process's environment before NCCL
// reads it, and SafeEnv gives the same setting to processes callers start.
// Keep NCCL_COMM_BLOCKING unset: set to 1 it makes init uncancellable.
package nccl
