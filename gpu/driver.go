package gpu

import "github.com/weightcast/weightcast/internal/dl"

// The driver layer. Every call into the CUDA driver goes through one small
// Go function named after the driver call (cuMemAlloc, cuStreamQuery, ...)
// that takes and returns Go types: handles as the integer types below,
// device addresses as uint64, host memory as []byte, results as CUDAResult.
// driver_cgo.go, the package's only cgo file, implements them over the C
// dispatch table of cuda_shim.h. driver_nocgo.go implements them for
// programs built without cgo: there the driver can never be loaded, so
// loadDriver fails with ErrNoCgo and every other call answers
// resultFunctionNotFound, exactly what the C shims answer before a driver
// is loaded. The rest of the package is pure Go and builds either way.
//
// A new driver call takes four steps: a field named after its symbol in
// the dispatch table (cuda_shim.h; loadDriver's dl.Fill looks every field
// up by its name), a static inline shim
// that answers WC_CUDA_FUNCTION_NOT_FOUND for a NULL pointer and makes the
// context current, a Go function in driver_cgo.go (marked noescape and
// nocallback if it takes pointers), and its twin in driver_nocgo.go. A new
// kernel needs none of these: cuLaunchKernel takes a 1-D grid and up to
// maxKernelArgs 64-bit arguments.

// ErrNoCgo is matched (errors.Is) by the error of every CUDA entry point,
// and of package nccl's, in a program built without cgo. The same errors
// also match ErrNoDriver (nccl.ErrNoLibrary), so callers that treat "no
// GPU here" as a reason to skip or fall back to host memory do so here too.
// It is package dl's sentinel, which every library this module loads shares.
var ErrNoCgo = dl.ErrNoCgo

// Driver handles, kept as integers: a CUcontext, CUstream, CUevent,
// CUmodule or CUfunction is the address of a driver object that Go never
// dereferences (the shims cast it back in C), and a CUdevice is an int.
type (
	cuContext  uintptr
	cuStream   uintptr
	cuEvent    uintptr
	cuModule   uintptr
	cuFunction uintptr
	cuDevice   int32
)

// cuDeviceAttribute is a CUdevice_attribute for cuDeviceGetAttribute.
type cuDeviceAttribute int32

// attrMultiprocessorCount is CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT.
const attrMultiprocessorCount cuDeviceAttribute = 16

// attrMPSEnabled is CU_DEVICE_ATTRIBUTE_MPS_ENABLED (CUDA 12.3 and later
// drivers): whether contexts made on the device are shared through the
// Multi-Process Service.
const attrMPSEnabled cuDeviceAttribute = 133

// attrStreamMemOps64 is CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
// (CUDA 12 and later): whether the _v2 cuStreamWaitValue64 and
// cuStreamWriteValue64 work on the device. 93, the value before CUDA 12,
// is now the deprecated _V1 attribute of the v1 calls, which a CUDA 13
// driver answers 0 on an H100.
const attrStreamMemOps64 cuDeviceAttribute = 122

// maxKernelArgs bounds the arguments cuLaunchKernel passes to a kernel
// (WC_MAX_KERNEL_ARGS of cuda_shim.h).
const maxKernelArgs = 16

// moduleLogBytes bounds the PTX compiler's error log that moduleLoad
// returns.
const moduleLogBytes = 4096
