//go:build cgo

// cuda_shim.c holds the dispatch table declared in cuda_shim.h, which
// loadDriver (driver_cgo.go) fills through package internal/dl, and the
// shims too long to be inline. It is compiled only with cgo (the build
// constraint above): without it the package's Go twin, driver_nocgo.go,
// stands in.
#include <stdint.h>

#include "cuda_shim.h"

wc_cuda_table wc_cuda;

CUresult wc_copy_batch(uintptr_t ctx, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                       uintptr_t stream, int per_copy, int *how, CUresult *batch_err) {
  CUstream s = WC_STREAM(stream);
  *batch_err = WC_CUDA_SUCCESS;
  if (count == 0) {
    *how = 0;
    return WC_CUDA_SUCCESS;
  }
  CUresult r = wc_set(WC_CTX(ctx));
  if (r != WC_CUDA_SUCCESS)
    return r;
  if (!per_copy && (wc_cuda.cuMemcpyBatchAsync_v2 != NULL || wc_cuda.cuMemcpyBatchAsync != NULL)) {
    CUmemcpyAttributes attr = {0};
    attr.srcAccessOrder = WC_CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t idx = 0;
    if (wc_cuda.cuMemcpyBatchAsync_v2 != NULL) {
      *how = WC_BATCH_V2;
      r = wc_cuda.cuMemcpyBatchAsync_v2(dsts, srcs, sizes, count, &attr, &idx, 1, s);
    } else {
      size_t fail = 0;
      *how = WC_BATCH_V1;
      r = wc_cuda.cuMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &idx, 1, &fail, s);
    }
    if (r == WC_CUDA_SUCCESS)
      return r;
    *batch_err = r;
  }
  if (wc_cuda.cuMemcpyAsync == NULL)
    return WC_CUDA_FUNCTION_NOT_FOUND;
  *how = WC_BATCH_PER_COPY;
  for (size_t i = 0; i < count; i++) {
    r = wc_cuda.cuMemcpyAsync(dsts[i], srcs[i], sizes[i], s);
    if (r != WC_CUDA_SUCCESS)
      return r;
  }
  return WC_CUDA_SUCCESS;
}

CUresult wc_module_load(uintptr_t ctx, const char *image, uintptr_t *m, char *log, size_t loglen) {
  if (loglen > 0)
    log[0] = 0;
  *m = 0;
  CUresult r = wc_set(WC_CTX(ctx));
  if (r != WC_CUDA_SUCCESS)
    return r;
  CUmodule mod = NULL;
  if (wc_cuda.cuModuleLoadDataEx != NULL && loglen > 0) {
    int opts[2] = {WC_CU_JIT_ERROR_LOG_BUFFER, WC_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[2] = {log, (void *)(uintptr_t)loglen};
    r = wc_cuda.cuModuleLoadDataEx(&mod, image, 2, opts, vals);
    log[loglen - 1] = 0;
  } else if (wc_cuda.cuModuleLoadData == NULL) {
    return WC_CUDA_FUNCTION_NOT_FOUND;
  } else {
    r = wc_cuda.cuModuleLoadData(&mod, image);
  }
  *m = (uintptr_t)mod;
  return r;
}
