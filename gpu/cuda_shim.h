// cuda_shim.h is a hand-written minimal subset of the CUDA driver API
// (cuda.h): only the types, constants and prototypes this package uses. No
// CUDA toolkit is needed to build; libcuda.so.1 is opened at run time and
// its functions are looked up into the dispatch table wc_cuda, both through
// package internal/dl (loadDriver in driver_cgo.go). Every call goes through a static inline wc_ shim that returns
// WC_CUDA_FUNCTION_NOT_FOUND when the function is missing (or the library
// was never loaded), and that first makes the given context current on the
// calling OS thread, so that any goroutine, on any thread, may call.
// driver_cgo.go, the package's only cgo file, is the only one that includes
// this header: it wraps each shim in a Go function of Go types.
//
// The driver's versioned entry points are used (cuMemAlloc_v2, ...): the
// unversioned names are older ABIs kept for old binaries.
#ifndef WEIGHTCAST_CUDA_SHIM_H
#define WEIGHTCAST_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult; // an enum in cuda.h; every value fits an int
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; // 64-bit device address
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct {
  char reserved[64];
} CUipcMemHandle;
typedef struct {
  char bytes[16];
} CUuuid;

// CUmemLocation and CUmemcpyAttributes (CUmemcpyAttributes_v1) of cuda.h
// 12.8+, for cuMemcpyBatchAsync. The location hints only matter for managed
// memory; this package leaves them zero.
typedef struct {
  int type; // CUmemLocationType
  int id;
} CUmemLocation;

typedef struct {
  int srcAccessOrder; // CUmemcpySrcAccessOrder
  CUmemLocation srcLocHint;
  CUmemLocation dstLocHint;
  unsigned int flags;
} CUmemcpyAttributes;

enum {
  WC_CUDA_SUCCESS = 0,
  WC_CUDA_ERROR_INVALID_VALUE = 1,
  WC_CUDA_ERROR_NOT_READY = 600,
  // Not a CUDA code: the shim's answer when a function pointer is NULL.
  WC_CUDA_FUNCTION_NOT_FOUND = 0x7fff0001,

  WC_CU_STREAM_NON_BLOCKING = 0x1,
  WC_CU_EVENT_DISABLE_TIMING = 0x2,
  WC_CU_MEMHOSTALLOC_PORTABLE = 0x1,
  WC_CU_MEMHOSTALLOC_DEVICEMAP = 0x2,
  WC_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1,
  // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM: sources are read in stream order.
  WC_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 0x1,

  // How wc_copy_batch queued its copies (its *how).
  WC_BATCH_V2 = 1,       // cuMemcpyBatchAsync_v2 (CUDA 13.0 ABI)
  WC_BATCH_V1 = 2,       // cuMemcpyBatchAsync (CUDA 12.8 ABI, with failIdx)
  WC_BATCH_PER_COPY = 3, // one cuMemcpyAsync per copy

  // CUpointer_attribute CU_POINTER_ATTRIBUTE_BUFFER_ID: a process-wide
  // unique id of the allocation holding a pointer (unsigned long long).
  WC_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,

  // CUdevice_attribute values for cuDeviceGetAttribute.
  WC_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,

  // CUjit_option values for cuModuleLoadDataEx.
  WC_CU_JIT_ERROR_LOG_BUFFER = 5,
  WC_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
};

// wc_cuda_table holds the driver functions found by dlsym; NULL where the
// symbol is missing. Each field is named after its symbol and is nothing
// but a function pointer: dl.Fill takes the names from the fields, so the
// table is its own list of symbols.
typedef struct {
  CUresult (*cuInit)(unsigned int flags);
  CUresult (*cuDriverGetVersion)(int *version);
  CUresult (*cuGetErrorName)(CUresult err, const char **name);
  CUresult (*cuGetErrorString)(CUresult err, const char **str);
  CUresult (*cuDeviceGetCount)(int *count);
  CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
  CUresult (*cuDeviceGetName)(char *name, int len, CUdevice dev);
  CUresult (*cuDeviceGetAttribute)(int *v, int attrib, CUdevice dev);
  CUresult (*cuDeviceGetUuid_v2)(CUuuid *uuid, CUdevice dev);
  CUresult (*cuDeviceGetUuid)(CUuuid *uuid, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice dev);
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuMemGetInfo_v2)(size_t *free, size_t *total);
  CUresult (*cuMemAlloc_v2)(CUdeviceptr *dptr, size_t bytes);
  CUresult (*cuMemFree_v2)(CUdeviceptr dptr);
  CUresult (*cuMemGetAddressRange_v2)(CUdeviceptr *base, size_t *size, CUdeviceptr dptr);
  CUresult (*cuPointerGetAttribute)(void *data, int attribute, CUdeviceptr ptr);
  CUresult (*cuMemHostAlloc)(void **pp, size_t bytes, unsigned int flags);
  CUresult (*cuMemFreeHost)(void *p);
  CUresult (*cuMemcpyHtoDAsync_v2)(CUdeviceptr dst, const void *src, size_t n, CUstream s);
  CUresult (*cuMemcpyDtoHAsync_v2)(void *dst, CUdeviceptr src, size_t n, CUstream s);
  CUresult (*cuMemcpyDtoDAsync_v2)(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
  CUresult (*cuMemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t n, CUstream s);
  CUresult (*cuStreamCreate)(CUstream *s, unsigned int flags);
  CUresult (*cuStreamDestroy_v2)(CUstream s);
  CUresult (*cuStreamQuery)(CUstream s);
  CUresult (*cuStreamWaitEvent)(CUstream s, CUevent e, unsigned int flags);
  CUresult (*cuStreamWaitValue32_v2)(CUstream s, CUdeviceptr addr, uint32_t value, unsigned int flags);
  CUresult (*cuStreamWriteValue32_v2)(CUstream s, CUdeviceptr addr, uint32_t value, unsigned int flags);
  CUresult (*cuStreamWaitValue64_v2)(CUstream s, CUdeviceptr addr, uint64_t value, unsigned int flags);
  CUresult (*cuStreamWriteValue64_v2)(CUstream s, CUdeviceptr addr, uint64_t value, unsigned int flags);
  CUresult (*cuEventCreate)(CUevent *e, unsigned int flags);
  CUresult (*cuEventRecord)(CUevent e, CUstream s);
  CUresult (*cuEventQuery)(CUevent e);
  CUresult (*cuEventDestroy_v2)(CUevent e);
  CUresult (*cuEventElapsedTime_v2)(float *ms, CUevent start, CUevent end);
  CUresult (*cuEventElapsedTime)(float *ms, CUevent start, CUevent end);
  CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *h, CUdeviceptr dptr);
  CUresult (*cuIpcOpenMemHandle_v2)(CUdeviceptr *dptr, CUipcMemHandle h, unsigned int flags);
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr dptr);
  CUresult (*cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
  CUresult (*cuMemcpyBatchAsync_v2)(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                    CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream s);
  CUresult (*cuMemcpyBatchAsync)(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                 CUmemcpyAttributes *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx,
                                 CUstream s);
  CUresult (*cuModuleLoadData)(CUmodule *m, const void *image);
  CUresult (*cuModuleLoadDataEx)(CUmodule *m, const void *image, unsigned int numOptions, int *options,
                                 void **optionValues);
  CUresult (*cuModuleGetFunction)(CUfunction *f, CUmodule m, const char *name);
  CUresult (*cuModuleUnload)(CUmodule m);
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned int gridX, unsigned int gridY, unsigned int gridZ,
                             unsigned int blockX, unsigned int blockY, unsigned int blockZ, unsigned int sharedBytes,
                             CUstream s, void **params, void **extra);
} wc_cuda_table;

extern wc_cuda_table wc_cuda;

#define WC_NEED(fn)        \
  if (wc_cuda.fn == NULL)  \
  return WC_CUDA_FUNCTION_NOT_FOUND

// Handles (contexts, streams, events, modules, functions) cross into Go as
// integers: Go keeps them in uintptr fields, never as pointers, and the
// shims cast them back here.
#define WC_CTX(h) ((CUcontext)(h))
#define WC_STREAM(h) ((CUstream)(h))
#define WC_EVENT(h) ((CUevent)(h))
#define WC_MODULE(h) ((CUmodule)(h))
#define WC_FUNC(h) ((CUfunction)(h))

// wc_set makes ctx current on this OS thread (the CUDA current context is
// per thread, and a goroutine may move between threads between cgo calls).
static inline CUresult wc_set(CUcontext ctx) {
  WC_NEED(cuCtxSetCurrent);
  return wc_cuda.cuCtxSetCurrent(ctx);
}

#define WC_SET(ctx)                 \
  do {                              \
    CUresult r_ = wc_set(WC_CTX(ctx)); \
    if (r_ != WC_CUDA_SUCCESS)      \
      return r_;                    \
  } while (0)

static inline CUresult wc_cuInit(void) {
  WC_NEED(cuInit);
  return wc_cuda.cuInit(0);
}

static inline CUresult wc_cuDriverGetVersion(int *v) {
  WC_NEED(cuDriverGetVersion);
  return wc_cuda.cuDriverGetVersion(v);
}

static inline CUresult wc_cuGetErrorString(CUresult err, const char **s) {
  WC_NEED(cuGetErrorString);
  return wc_cuda.cuGetErrorString(err, s);
}

static inline CUresult wc_cuDeviceGetCount(int *n) {
  WC_NEED(cuDeviceGetCount);
  return wc_cuda.cuDeviceGetCount(n);
}

static inline CUresult wc_cuDeviceGet(CUdevice *dev, int ordinal) {
  WC_NEED(cuDeviceGet);
  return wc_cuda.cuDeviceGet(dev, ordinal);
}

static inline CUresult wc_cuDeviceGetName(char *name, int len, CUdevice dev) {
  WC_NEED(cuDeviceGetName);
  return wc_cuda.cuDeviceGetName(name, len, dev);
}

static inline CUresult wc_cuDeviceGetAttribute(int *v, int attrib, CUdevice dev) {
  WC_NEED(cuDeviceGetAttribute);
  return wc_cuda.cuDeviceGetAttribute(v, attrib, dev);
}

// wc_cuDeviceGetUuid uses cuDeviceGetUuid_v2, or the original where the
// driver lacks it (before CUDA 11.4; the two differ only for MIG
// instances, which the original does not tell apart).
static inline CUresult wc_cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  if (wc_cuda.cuDeviceGetUuid_v2 != NULL)
    return wc_cuda.cuDeviceGetUuid_v2(uuid, dev);
  WC_NEED(cuDeviceGetUuid);
  return wc_cuda.cuDeviceGetUuid(uuid, dev);
}

static inline CUresult wc_cuDevicePrimaryCtxRetain(uintptr_t *ctx, CUdevice dev) {
  WC_NEED(cuDevicePrimaryCtxRetain);
  CUcontext c = NULL;
  CUresult r = wc_cuda.cuDevicePrimaryCtxRetain(&c, dev);
  *ctx = (uintptr_t)c;
  return r;
}

static inline CUresult wc_cuDevicePrimaryCtxRelease(CUdevice dev) {
  WC_NEED(cuDevicePrimaryCtxRelease_v2);
  return wc_cuda.cuDevicePrimaryCtxRelease_v2(dev);
}

static inline CUresult wc_cuCtxSetCurrent(uintptr_t ctx) { return wc_set(WC_CTX(ctx)); }

static inline CUresult wc_cuMemGetInfo(uintptr_t ctx, size_t *free, size_t *total) {
  WC_NEED(cuMemGetInfo_v2);
  WC_SET(ctx);
  return wc_cuda.cuMemGetInfo_v2(free, total);
}

static inline CUresult wc_cuMemAlloc(uintptr_t ctx, CUdeviceptr *p, size_t n) {
  WC_NEED(cuMemAlloc_v2);
  WC_SET(ctx);
  return wc_cuda.cuMemAlloc_v2(p, n);
}

static inline CUresult wc_cuMemFree(uintptr_t ctx, CUdeviceptr p) {
  WC_NEED(cuMemFree_v2);
  WC_SET(ctx);
  return wc_cuda.cuMemFree_v2(p);
}

static inline CUresult wc_cuMemHostAlloc(uintptr_t ctx, void **pp, size_t n) {
  WC_NEED(cuMemHostAlloc);
  WC_SET(ctx);
  return wc_cuda.cuMemHostAlloc(pp, n, WC_CU_MEMHOSTALLOC_PORTABLE | WC_CU_MEMHOSTALLOC_DEVICEMAP);
}

static inline CUresult wc_cuMemFreeHost(uintptr_t ctx, void *p) {
  WC_NEED(cuMemFreeHost);
  WC_SET(ctx);
  return wc_cuda.cuMemFreeHost(p);
}

static inline CUresult wc_cuMemcpyHtoDAsync(uintptr_t ctx, CUdeviceptr dst, const void *src, size_t n, uintptr_t s) {
  WC_NEED(cuMemcpyHtoDAsync_v2);
  WC_SET(ctx);
  return wc_cuda.cuMemcpyHtoDAsync_v2(dst, src, n, WC_STREAM(s));
}

static inline CUresult wc_cuMemcpyDtoHAsync(uintptr_t ctx, void *dst, CUdeviceptr src, size_t n, uintptr_t s) {
  WC_NEED(cuMemcpyDtoHAsync_v2);
  WC_SET(ctx);
  return wc_cuda.cuMemcpyDtoHAsync_v2(dst, src, n, WC_STREAM(s));
}

static inline CUresult wc_cuMemcpyDtoDAsync(uintptr_t ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, uintptr_t s) {
  WC_NEED(cuMemcpyDtoDAsync_v2);
  WC_SET(ctx);
  return wc_cuda.cuMemcpyDtoDAsync_v2(dst, src, n, WC_STREAM(s));
}

static inline CUresult wc_cuMemsetD8Async(uintptr_t ctx, CUdeviceptr dst, unsigned char v, size_t n, uintptr_t s) {
  WC_NEED(cuMemsetD8Async);
  WC_SET(ctx);
  return wc_cuda.cuMemsetD8Async(dst, v, n, WC_STREAM(s));
}

static inline CUresult wc_cuStreamCreate(uintptr_t ctx, uintptr_t *s) {
  WC_NEED(cuStreamCreate);
  WC_SET(ctx);
  CUstream st = NULL;
  CUresult r = wc_cuda.cuStreamCreate(&st, WC_CU_STREAM_NON_BLOCKING);
  *s = (uintptr_t)st;
  return r;
}

static inline CUresult wc_cuStreamDestroy(uintptr_t ctx, uintptr_t s) {
  WC_NEED(cuStreamDestroy_v2);
  WC_SET(ctx);
  return wc_cuda.cuStreamDestroy_v2(WC_STREAM(s));
}

static inline CUresult wc_cuStreamQuery(uintptr_t ctx, uintptr_t s) {
  WC_NEED(cuStreamQuery);
  WC_SET(ctx);
  return wc_cuda.cuStreamQuery(WC_STREAM(s));
}

static inline CUresult wc_cuStreamWaitEvent(uintptr_t ctx, uintptr_t s, uintptr_t e) {
  WC_NEED(cuStreamWaitEvent);
  WC_SET(ctx);
  return wc_cuda.cuStreamWaitEvent(WC_STREAM(s), WC_EVENT(e), 0);
}

// wc_cuStreamWaitValue32 waits with CU_STREAM_WAIT_VALUE_GEQ (0): until
// (int32_t)(*addr - value) >= 0.
static inline CUresult wc_cuStreamWaitValue32(uintptr_t ctx, uintptr_t s, CUdeviceptr addr, uint32_t value) {
  WC_NEED(cuStreamWaitValue32_v2);
  WC_SET(ctx);
  return wc_cuda.cuStreamWaitValue32_v2(WC_STREAM(s), addr, value, 0);
}

// wc_cuStreamWriteValue32 writes with CU_STREAM_WRITE_VALUE_DEFAULT (0):
// after the work queued before it, behind a memory barrier.
static inline CUresult wc_cuStreamWriteValue32(uintptr_t ctx, uintptr_t s, CUdeviceptr addr, uint32_t value) {
  WC_NEED(cuStreamWriteValue32_v2);
  WC_SET(ctx);
  return wc_cuda.cuStreamWriteValue32_v2(WC_STREAM(s), addr, value, 0);
}

// wc_cuStreamWaitValue64 waits with CU_STREAM_WAIT_VALUE_GEQ (0): until
// (int64_t)(*addr - value) >= 0.
static inline CUresult wc_cuStreamWaitValue64(uintptr_t ctx, uintptr_t s, CUdeviceptr addr, uint64_t value) {
  WC_NEED(cuStreamWaitValue64_v2);
  WC_SET(ctx);
  return wc_cuda.cuStreamWaitValue64_v2(WC_STREAM(s), addr, value, 0);
}

// wc_cuStreamWriteValue64 writes with CU_STREAM_WRITE_VALUE_DEFAULT (0).
static inline CUresult wc_cuStreamWriteValue64(uintptr_t ctx, uintptr_t s, CUdeviceptr addr, uint64_t value) {
  WC_NEED(cuStreamWriteValue64_v2);
  WC_SET(ctx);
  return wc_cuda.cuStreamWriteValue64_v2(WC_STREAM(s), addr, value, 0);
}

static inline CUresult wc_cuEventCreate(uintptr_t ctx, uintptr_t *e) {
  WC_NEED(cuEventCreate);
  WC_SET(ctx);
  CUevent ev = NULL;
  CUresult r = wc_cuda.cuEventCreate(&ev, WC_CU_EVENT_DISABLE_TIMING);
  *e = (uintptr_t)ev;
  return r;
}

// wc_cuEventCreateTimed creates an event that keeps the time the GPU
// reached it, for wc_cuEventElapsedTime.
static inline CUresult wc_cuEventCreateTimed(uintptr_t ctx, uintptr_t *e) {
  WC_NEED(cuEventCreate);
  WC_SET(ctx);
  CUevent ev = NULL;
  CUresult r = wc_cuda.cuEventCreate(&ev, 0);
  *e = (uintptr_t)ev;
  return r;
}

// wc_cuEventElapsedTime is cuEventElapsedTime_v2 (CUDA 12.8+), or the
// original where the driver is older.
static inline CUresult wc_cuEventElapsedTime(uintptr_t ctx, float *ms, uintptr_t start, uintptr_t end) {
  if (wc_cuda.cuEventElapsedTime_v2 == NULL) {
    WC_NEED(cuEventElapsedTime);
  }
  WC_SET(ctx);
  if (wc_cuda.cuEventElapsedTime_v2 != NULL)
    return wc_cuda.cuEventElapsedTime_v2(ms, WC_EVENT(start), WC_EVENT(end));
  return wc_cuda.cuEventElapsedTime(ms, WC_EVENT(start), WC_EVENT(end));
}

static inline CUresult wc_cuEventRecord(uintptr_t ctx, uintptr_t e, uintptr_t s) {
  WC_NEED(cuEventRecord);
  WC_SET(ctx);
  return wc_cuda.cuEventRecord(WC_EVENT(e), WC_STREAM(s));
}

static inline CUresult wc_cuEventQuery(uintptr_t ctx, uintptr_t e) {
  WC_NEED(cuEventQuery);
  WC_SET(ctx);
  return wc_cuda.cuEventQuery(WC_EVENT(e));
}

static inline CUresult wc_cuEventDestroy(uintptr_t ctx, uintptr_t e) {
  WC_NEED(cuEventDestroy_v2);
  WC_SET(ctx);
  return wc_cuda.cuEventDestroy_v2(WC_EVENT(e));
}

static inline CUresult wc_cuMemGetAddressRange(uintptr_t ctx, CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  WC_NEED(cuMemGetAddressRange_v2);
  WC_SET(ctx);
  return wc_cuda.cuMemGetAddressRange_v2(base, size, p);
}

static inline CUresult wc_cuPointerGetBufferID(uintptr_t ctx, unsigned long long *id, CUdeviceptr p) {
  WC_NEED(cuPointerGetAttribute);
  WC_SET(ctx);
  return wc_cuda.cuPointerGetAttribute(id, WC_CU_POINTER_ATTRIBUTE_BUFFER_ID, p);
}

static inline CUresult wc_cuIpcGetMemHandle(uintptr_t ctx, CUipcMemHandle *h, CUdeviceptr p) {
  WC_NEED(cuIpcGetMemHandle);
  WC_SET(ctx);
  return wc_cuda.cuIpcGetMemHandle(h, p);
}

// wc_cuIpcOpenMemHandle takes the 64-byte handle by pointer and passes it
// by value, so that the C compiler applies the calling convention.
static inline CUresult wc_cuIpcOpenMemHandle(uintptr_t ctx, CUdeviceptr *p, const CUipcMemHandle *h) {
  WC_NEED(cuIpcOpenMemHandle_v2);
  WC_SET(ctx);
  return wc_cuda.cuIpcOpenMemHandle_v2(p, *h, WC_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
}

static inline CUresult wc_cuIpcCloseMemHandle(uintptr_t ctx, CUdeviceptr p) {
  WC_NEED(cuIpcCloseMemHandle);
  WC_SET(ctx);
  return wc_cuda.cuIpcCloseMemHandle(p);
}

static inline CUresult wc_cuModuleGetFunction(uintptr_t ctx, uintptr_t *f, uintptr_t m, const char *name) {
  WC_NEED(cuModuleGetFunction);
  WC_SET(ctx);
  CUfunction fn = NULL;
  CUresult r = wc_cuda.cuModuleGetFunction(&fn, WC_MODULE(m), name);
  *f = (uintptr_t)fn;
  return r;
}

static inline CUresult wc_cuModuleUnload(uintptr_t ctx, uintptr_t m) {
  WC_NEED(cuModuleUnload);
  WC_SET(ctx);
  return wc_cuda.cuModuleUnload(WC_MODULE(m));
}

// WC_MAX_KERNEL_ARGS bounds the arguments wc_launch passes to a kernel.
#define WC_MAX_KERNEL_ARGS 16

// wc_launch launches f on a grid of blocks×1×1 blocks of threads×1×1
// threads, no dynamic shared memory, on s, with nargs arguments: kernel
// argument i is read from args[i], the driver taking as many bytes as the
// kernel's parameter i has (8 for a .u64, 4 for a .u32: the low half of
// the 64-bit word on these little-endian machines). The driver copies the
// arguments during the call.
static inline CUresult wc_launch(uintptr_t ctx, uintptr_t f, unsigned int blocks, unsigned int threads, uintptr_t s,
                                 uint64_t *args, unsigned int nargs) {
  WC_NEED(cuLaunchKernel);
  if (nargs > WC_MAX_KERNEL_ARGS)
    return WC_CUDA_ERROR_INVALID_VALUE;
  WC_SET(ctx);
  void *params[WC_MAX_KERNEL_ARGS];
  for (unsigned int i = 0; i < nargs; i++)
    params[i] = &args[i];
  return wc_cuda.cuLaunchKernel(WC_FUNC(f), blocks, 1, 1, threads, 1, 1, 0, WC_STREAM(s), params, NULL);
}

// wc_module_load loads a NUL-terminated PTX (or cubin) image into ctx:
// cuModuleLoadDataEx, which writes the JIT compiler's error log (at most
// loglen bytes, NUL-terminated) into log, where the driver has it, else
// cuModuleLoadData. Defined in cuda_shim.c.
CUresult wc_module_load(uintptr_t ctx, const char *image, uintptr_t *m, char *log, size_t loglen);

// wc_copy_batch queues count pointer-to-pointer copies (device or pinned
// host addresses, told apart by unified addressing) on s in one call:
// cuMemcpyBatchAsync_v2 where the driver has it, else the 12.8 ABI
// cuMemcpyBatchAsync, else a loop of cuMemcpyAsync; per_copy forces the
// loop. If the batch call fails, the copies are queued again one by one (a
// batch that fails to parse queues nothing, and repeating a copy is
// harmless); *batch_err then holds the batch call's result. *how says which
// path queued them. Defined in cuda_shim.c.
CUresult wc_copy_batch(uintptr_t ctx, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                       uintptr_t s, int per_copy, int *how, CUresult *batch_err);

#endif
