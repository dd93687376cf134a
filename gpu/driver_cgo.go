//go:build cgo

package gpu

/*
#cgo noescape wc_cuDriverGetVersion
#cgo nocallback wc_cuDriverGetVersion
#cgo noescape wc_cuGetErrorString
#cgo nocallback wc_cuGetErrorString
#cgo noescape wc_cuDeviceGetCount
#cgo nocallback wc_cuDeviceGetCount
#cgo noescape wc_cuDeviceGet
#cgo nocallback wc_cuDeviceGet
#cgo noescape wc_cuDeviceGetName
#cgo nocallback wc_cuDeviceGetName
#cgo noescape wc_cuDeviceGetAttribute
#cgo nocallback wc_cuDeviceGetAttribute
#cgo noescape wc_cuDeviceGetUuid
#cgo nocallback wc_cuDeviceGetUuid
#cgo noescape wc_cuDevicePrimaryCtxRetain
#cgo nocallback wc_cuDevicePrimaryCtxRetain
#cgo noescape wc_cuMemGetInfo
#cgo nocallback wc_cuMemGetInfo
#cgo noescape wc_cuMemAlloc
#cgo nocallback wc_cuMemAlloc
#cgo noescape wc_cuMemHostAlloc
#cgo nocallback wc_cuMemHostAlloc
#cgo noescape wc_cuMemcpyHtoDAsync
#cgo nocallback wc_cuMemcpyHtoDAsync
#cgo noescape wc_cuMemcpyDtoHAsync
#cgo nocallback wc_cuMemcpyDtoHAsync
#cgo noescape wc_cuStreamCreate
#cgo nocallback wc_cuStreamCreate
#cgo noescape wc_cuEventCreate
#cgo nocallback wc_cuEventCreate
#cgo noescape wc_cuEventCreateTimed
#cgo nocallback wc_cuEventCreateTimed
#cgo noescape wc_cuEventElapsedTime
#cgo nocallback wc_cuEventElapsedTime
#cgo noescape wc_cuMemGetAddressRange
#cgo nocallback wc_cuMemGetAddressRange
#cgo noescape wc_cuPointerGetBufferID
#cgo nocallback wc_cuPointerGetBufferID
#cgo noescape wc_cuIpcGetMemHandle
#cgo nocallback wc_cuIpcGetMemHandle
#cgo noescape wc_cuIpcOpenMemHandle
#cgo nocallback wc_cuIpcOpenMemHandle
#cgo noescape wc_module_load
#cgo nocallback wc_module_load
#cgo noescape wc_cuModuleGetFunction
#cgo nocallback wc_cuModuleGetFunction
#cgo noescape wc_launch
#cgo nocallback wc_launch
#cgo noescape wc_copy_batch
#cgo nocallback wc_copy_batch
#include <stdlib.h>
#include "cuda_shim.h"
*/
import "C"

import (
	"unsafe"

	"github.com/weightcast/weightcast/internal/dl"
)

// This is the package's only cgo file: each function below is one call of
// a C shim of cuda_shim.h, with Go types on the Go side. driver_nocgo.go
// has the same functions for builds without cgo; driver.go says why.
//
// No shim keeps a Go pointer after it returns, as cgo's rules require:
// out-parameters are written during the call, and Go memory handed to a
// copy has been read or written by the time the call returns (the driver
// stages pageable memory; pinned memory, used later, is C memory). So the
// shims that take pointers are marked noescape, and nocallback (none calls
// into Go, and C must not point into a stack that a callback could move):
// their arguments may stay on the Go stack, and a call allocates nothing.

// The C enums and the Go constants they mirror are the same numbers: each
// pair is checked when this file compiles (converting a negative constant
// to uint does not compile).
const (
	_ = uint(int(resultFunctionNotFound) - C.WC_CUDA_FUNCTION_NOT_FOUND)
	_ = uint(C.WC_CUDA_FUNCTION_NOT_FOUND - int(resultFunctionNotFound))
	_ = uint(int(BatchV2) - C.WC_BATCH_V2)
	_ = uint(C.WC_BATCH_V2 - int(BatchV2))
	_ = uint(int(BatchV1) - C.WC_BATCH_V1)
	_ = uint(C.WC_BATCH_V1 - int(BatchV1))
	_ = uint(int(BatchPerCopy) - C.WC_BATCH_PER_COPY)
	_ = uint(C.WC_BATCH_PER_COPY - int(BatchPerCopy))
	_ = uint(int(attrMultiprocessorCount) - C.WC_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
	_ = uint(C.WC_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT - int(attrMultiprocessorCount))
	_ = uint(maxKernelArgs - C.WC_MAX_KERNEL_ARGS)
	_ = uint(C.WC_MAX_KERNEL_ARGS - maxKernelArgs)
)

// loadDriver opens the driver library at path and fills the dispatch
// table, both through package dl; the error is dl's, whose text is the
// loader's message. The library stays open for the process's life.
func loadDriver(path string) error {
	lib, err := dl.Open(path)
	if err != nil {
		return err
	}
	var t C.wc_cuda_table
	dl.Fill(lib, &t) // a missing function answers "not found" when called
	C.wc_cuda = t
	return nil
}

func cuInit() CUDAResult { return CUDAResult(C.wc_cuInit()) }

func cuDriverGetVersion() (int, CUDAResult) {
	var v C.int
	r := C.wc_cuDriverGetVersion(&v)
	return int(v), CUDAResult(r)
}

// cuGetErrorString returns the driver's description of r; ok is false
// where the driver has none (or is not loaded).
func cuGetErrorString(r CUDAResult) (desc string, ok bool) {
	var s *C.char
	if C.wc_cuGetErrorString(C.CUresult(r), &s) != 0 || s == nil {
		return "", false
	}
	return C.GoString(s), true
}

func cuDeviceGetCount() (int, CUDAResult) {
	var n C.int
	r := C.wc_cuDeviceGetCount(&n)
	return int(n), CUDAResult(r)
}

func cuDeviceGet(ordinal int) (cuDevice, CUDAResult) {
	var d C.CUdevice
	r := C.wc_cuDeviceGet(&d, C.int(ordinal))
	return cuDevice(d), CUDAResult(r)
}

func cuDeviceGetName(dev cuDevice) (string, CUDAResult) {
	var name [256]C.char
	if r := CUDAResult(C.wc_cuDeviceGetName(&name[0], C.int(len(name)), C.CUdevice(dev))); r != 0 {
		return "", r
	}
	return C.GoString(&name[0]), 0
}

func cuDeviceGetAttribute(attr cuDeviceAttribute, dev cuDevice) (int, CUDAResult) {
	var v C.int
	r := C.wc_cuDeviceGetAttribute(&v, C.int(attr), C.CUdevice(dev))
	return int(v), CUDAResult(r)
}

// cuDeviceGetUuid returns the device's UUID (cuDeviceGetUuid_v2, or the
// original on drivers before CUDA 11.4).
func cuDeviceGetUuid(dev cuDevice) ([16]byte, CUDAResult) {
	var u [16]byte
	r := C.wc_cuDeviceGetUuid((*C.CUuuid)(unsafe.Pointer(&u[0])), C.CUdevice(dev))
	return u, CUDAResult(r)
}

func cuDevicePrimaryCtxRetain(dev cuDevice) (cuContext, CUDAResult) {
	var c C.uintptr_t
	r := C.wc_cuDevicePrimaryCtxRetain(&c, C.CUdevice(dev))
	return cuContext(c), CUDAResult(r)
}

func cuDevicePrimaryCtxRelease(dev cuDevice) CUDAResult {
	return CUDAResult(C.wc_cuDevicePrimaryCtxRelease(C.CUdevice(dev)))
}

// cuCtxSetCurrent makes ctx current on the calling OS thread; every other
// call with a ctx argument does that itself, in the same C call.
func cuCtxSetCurrent(ctx cuContext) CUDAResult {
	return CUDAResult(C.wc_cuCtxSetCurrent(C.uintptr_t(ctx)))
}

func cuMemGetInfo(ctx cuContext) (free, total uint64, r CUDAResult) {
	var f, t C.size_t
	r = CUDAResult(C.wc_cuMemGetInfo(C.uintptr_t(ctx), &f, &t))
	return uint64(f), uint64(t), r
}

func cuMemAlloc(ctx cuContext, n int) (uint64, CUDAResult) {
	var p C.CUdeviceptr
	r := C.wc_cuMemAlloc(C.uintptr_t(ctx), &p, C.size_t(n))
	return uint64(p), CUDAResult(r)
}

func cuMemFree(ctx cuContext, p uint64) CUDAResult {
	return CUDAResult(C.wc_cuMemFree(C.uintptr_t(ctx), C.CUdeviceptr(p)))
}

// cuMemHostAlloc returns n bytes of pinned host memory: C memory, portable
// to every context and mapped into the device address space.
func cuMemHostAlloc(ctx cuContext, n int) (unsafe.Pointer, CUDAResult) {
	var p unsafe.Pointer
	r := C.wc_cuMemHostAlloc(C.uintptr_t(ctx), &p, C.size_t(n))
	return p, CUDAResult(r)
}

func cuMemFreeHost(ctx cuContext, p unsafe.Pointer) CUDAResult {
	return CUDAResult(C.wc_cuMemFreeHost(C.uintptr_t(ctx), p))
}

// cuMemcpyHtoDAsync queues a copy of src to dst; src is not empty.
func cuMemcpyHtoDAsync(ctx cuContext, dst uint64, src []byte, s cuStream) CUDAResult {
	return CUDAResult(C.wc_cuMemcpyHtoDAsync(C.uintptr_t(ctx), C.CUdeviceptr(dst), unsafe.Pointer(&src[0]),
		C.size_t(len(src)), C.uintptr_t(s)))
}

// cuMemcpyDtoHAsync queues a copy from src into dst; dst is not empty.
func cuMemcpyDtoHAsync(ctx cuContext, dst []byte, src uint64, s cuStream) CUDAResult {
	return CUDAResult(C.wc_cuMemcpyDtoHAsync(C.uintptr_t(ctx), unsafe.Pointer(&dst[0]), C.CUdeviceptr(src),
		C.size_t(len(dst)), C.uintptr_t(s)))
}

func cuMemcpyDtoDAsync(ctx cuContext, dst, src uint64, n int, s cuStream) CUDAResult {
	return CUDAResult(C.wc_cuMemcpyDtoDAsync(C.uintptr_t(ctx), C.CUdeviceptr(dst), C.CUdeviceptr(src),
		C.size_t(n), C.uintptr_t(s)))
}

func cuMemsetD8Async(ctx cuContext, dst uint64, v byte, n int, s cuStream) CUDAResult {
	return CUDAResult(C.wc_cuMemsetD8Async(C.uintptr_t(ctx), C.CUdeviceptr(dst), C.uchar(v), C.size_t(n),
		C.uintptr_t(s)))
}

// cuStreamCreate creates a CU_STREAM_NON_BLOCKING stream.
func cuStreamCreate(ctx cuContext) (cuStream, CUDAResult) {
	var s C.uintptr_t
	r := C.wc_cuStreamCreate(C.uintptr_t(ctx), &s)
	return cuStream(s), CUDAResult(r)
}

func cuStreamDestroy(ctx cuContext, s cuStream) CUDAResult {
	return CUDAResult(C.wc_cuStreamDestroy(C.uintptr_t(ctx), C.uintptr_t(s)))
}

func cuStreamQuery(ctx cuContext, s cuStream) CUDAResult {
	return CUDAResult(C.wc_cuStreamQuery(C.uintptr_t(ctx), C.uintptr_t(s)))
}

func cuStreamWaitEvent(ctx cuContext, s cuStream, e cuEvent) CUDAResult {
	return CUDAResult(C.wc_cuStreamWaitEvent(C.uintptr_t(ctx), C.uintptr_t(s), C.uintptr_t(e)))
}

func cuStreamWaitValue32(ctx cuContext, s cuStream, addr uint64, v uint32) CUDAResult {
	return CUDAResult(C.wc_cuStreamWaitValue32(C.uintptr_t(ctx), C.uintptr_t(s), C.CUdeviceptr(addr), C.uint32_t(v)))
}

func cuStreamWriteValue32(ctx cuContext, s cuStream, addr uint64, v uint32) CUDAResult {
	return CUDAResult(C.wc_cuStreamWriteValue32(C.uintptr_t(ctx), C.uintptr_t(s), C.CUdeviceptr(addr), C.uint32_t(v)))
}

func cuStreamWaitValue64(ctx cuContext, s cuStream, addr uint64, v uint64) CUDAResult {
	return CUDAResult(C.wc_cuStreamWaitValue64(C.uintptr_t(ctx), C.uintptr_t(s), C.CUdeviceptr(addr), C.uint64_t(v)))
}

func cuStreamWriteValue64(ctx cuContext, s cuStream, addr uint64, v uint64) CUDAResult {
	return CUDAResult(C.wc_cuStreamWriteValue64(C.uintptr_t(ctx), C.uintptr_t(s), C.CUdeviceptr(addr), C.uint64_t(v)))
}

// cuEventCreate creates an event without timing (CU_EVENT_DISABLE_TIMING).
func cuEventCreate(ctx cuContext) (cuEvent, CUDAResult) {
	var e C.uintptr_t
	r := C.wc_cuEventCreate(C.uintptr_t(ctx), &e)
	return cuEvent(e), CUDAResult(r)
}

// cuEventCreateTimed creates an event that keeps the time the GPU reached
// it (no flags), for cuEventElapsedTime.
func cuEventCreateTimed(ctx cuContext) (cuEvent, CUDAResult) {
	var e C.uintptr_t
	r := C.wc_cuEventCreateTimed(C.uintptr_t(ctx), &e)
	return cuEvent(e), CUDAResult(r)
}

// cuEventElapsedTime returns the milliseconds from start to end
// (cuEventElapsedTime_v2, or the original on drivers before CUDA 12.8).
func cuEventElapsedTime(ctx cuContext, start, end cuEvent) (float32, CUDAResult) {
	var ms C.float
	r := C.wc_cuEventElapsedTime(C.uintptr_t(ctx), &ms, C.uintptr_t(start), C.uintptr_t(end))
	return float32(ms), CUDAResult(r)
}

func cuEventRecord(ctx cuContext, e cuEvent, s cuStream) CUDAResult {
	return CUDAResult(C.wc_cuEventRecord(C.uintptr_t(ctx), C.uintptr_t(e), C.uintptr_t(s)))
}

func cuEventQuery(ctx cuContext, e cuEvent) CUDAResult {
	return CUDAResult(C.wc_cuEventQuery(C.uintptr_t(ctx), C.uintptr_t(e)))
}

func cuEventDestroy(ctx cuContext, e cuEvent) CUDAResult {
	return CUDAResult(C.wc_cuEventDestroy(C.uintptr_t(ctx), C.uintptr_t(e)))
}

// cuMemGetAddressRange returns the base and size of the allocation that
// holds the device address p (cuMemGetAddressRange_v2).
func cuMemGetAddressRange(ctx cuContext, p uint64) (base, size uint64, r CUDAResult) {
	var b C.CUdeviceptr
	var n C.size_t
	r = CUDAResult(C.wc_cuMemGetAddressRange(C.uintptr_t(ctx), &b, &n, C.CUdeviceptr(p)))
	return uint64(b), uint64(n), r
}

// cuPointerGetBufferID returns the process-wide unique id of the
// allocation that holds p (cuPointerGetAttribute with
// CU_POINTER_ATTRIBUTE_BUFFER_ID): a new allocation at the address of a
// freed one has another id.
func cuPointerGetBufferID(ctx cuContext, p uint64) (uint64, CUDAResult) {
	var id C.ulonglong
	r := C.wc_cuPointerGetBufferID(C.uintptr_t(ctx), &id, C.CUdeviceptr(p))
	return uint64(id), CUDAResult(r)
}

func cuIpcGetMemHandle(ctx cuContext, p uint64) (IPCHandle, CUDAResult) {
	var h IPCHandle
	r := C.wc_cuIpcGetMemHandle(C.uintptr_t(ctx), (*C.CUipcMemHandle)(unsafe.Pointer(&h[0])), C.CUdeviceptr(p))
	return h, CUDAResult(r)
}

// cuIpcOpenMemHandle maps the allocation h names, with
// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS; the C shim passes h by value.
func cuIpcOpenMemHandle(ctx cuContext, h *IPCHandle) (uint64, CUDAResult) {
	var p C.CUdeviceptr
	r := C.wc_cuIpcOpenMemHandle(C.uintptr_t(ctx), &p, (*C.CUipcMemHandle)(unsafe.Pointer(&h[0])))
	return uint64(p), CUDAResult(r)
}

func cuIpcCloseMemHandle(ctx cuContext, p uint64) CUDAResult {
	return CUDAResult(C.wc_cuIpcCloseMemHandle(C.uintptr_t(ctx), C.CUdeviceptr(p)))
}

// moduleLoad loads the PTX (or cubin) image into ctx with
// cuModuleLoadDataEx, or cuModuleLoadData where the driver lacks it, and
// returns the PTX compiler's error log (at most moduleLogBytes) with a
// failure.
func moduleLoad(ctx cuContext, image string) (m cuModule, log string, r CUDAResult) {
	img := C.CString(image)
	defer C.free(unsafe.Pointer(img))
	var buf [moduleLogBytes]C.char
	var mod C.uintptr_t
	r = CUDAResult(C.wc_module_load(C.uintptr_t(ctx), img, &mod, &buf[0], C.size_t(len(buf))))
	if r != 0 {
		return 0, C.GoString(&buf[0]), r
	}
	return cuModule(mod), "", 0
}

func cuModuleGetFunction(ctx cuContext, m cuModule, name string) (cuFunction, CUDAResult) {
	n := C.CString(name)
	defer C.free(unsafe.Pointer(n))
	var f C.uintptr_t
	r := C.wc_cuModuleGetFunction(C.uintptr_t(ctx), &f, C.uintptr_t(m), n)
	return cuFunction(f), CUDAResult(r)
}

func cuModuleUnload(ctx cuContext, m cuModule) CUDAResult {
	return CUDAResult(C.wc_cuModuleUnload(C.uintptr_t(ctx), C.uintptr_t(m)))
}

// cuLaunchKernel launches f on blocks blocks of threads threads on s, no
// dynamic shared memory, with args as its arguments: one 64-bit word per
// kernel parameter, of which the driver reads as many bytes as the
// parameter has (a .u32 parameter takes the word's low half, which is its
// first four bytes on the little-endian machines CUDA runs on). At most
// maxKernelArgs arguments.
func cuLaunchKernel(ctx cuContext, f cuFunction, blocks, threads uint32, s cuStream, args ...uint64) CUDAResult {
	var argp *C.uint64_t
	if len(args) > 0 {
		argp = (*C.uint64_t)(unsafe.Pointer(&args[0]))
	}
	return CUDAResult(C.wc_launch(C.uintptr_t(ctx), C.uintptr_t(f), C.uint(blocks), C.uint(threads), C.uintptr_t(s),
		argp, C.uint(len(args))))
}

// copyBatch queues the copies dsts[i] ← srcs[i] of sizes[i] bytes on s
// with wc_copy_batch: how says which path queued them, batchErr is the
// result of a batch call that failed and was replaced by per-copy calls.
// The three slices have one length.
func copyBatch(ctx cuContext, dsts, srcs, sizes []uint64, s cuStream, perCopy bool) (how BatchPath, batchErr, r CUDAResult) {
	if len(sizes) == 0 {
		return BatchNone, 0, 0
	}
	var h C.int
	var berr C.CUresult
	per := C.int(0)
	if perCopy {
		per = 1
	}
	r = CUDAResult(C.wc_copy_batch(C.uintptr_t(ctx),
		(*C.CUdeviceptr)(unsafe.Pointer(&dsts[0])),
		(*C.CUdeviceptr)(unsafe.Pointer(&srcs[0])),
		(*C.size_t)(unsafe.Pointer(&sizes[0])),
		C.size_t(len(sizes)), C.uintptr_t(s), per, &h, &berr))
	return BatchPath(h), CUDAResult(berr), r
}
