// cuda_shim.c opens the CUDA driver and fills the dispatch table declared in
// cuda_shim.h.
#include <dlfcn.h>
#include <stdio.h>

#include "cuda_shim.h"

wc_cuda_table wc_cuda;

int wc_cuda_load(const char *path, char *err, size_t errlen) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *msg = dlerror();
    snprintf(err, errlen, "%s", msg ? msg : "dlopen failed");
    return -1;
  }
  wc_cuda_table t = {0};
  t.lib = h;
#define WC_SYM(name) t.name = (__typeof__(t.name))dlsym(h, #name)
  WC_SYM(cuInit);
  WC_SYM(cuDriverGetVersion);
  WC_SYM(cuGetErrorName);
  WC_SYM(cuGetErrorString);
  WC_SYM(cuDeviceGetCount);
  WC_SYM(cuDeviceGet);
  WC_SYM(cuDeviceGetName);
  WC_SYM(cuDevicePrimaryCtxRetain);
  WC_SYM(cuDevicePrimaryCtxRelease_v2);
  WC_SYM(cuCtxSetCurrent);
  WC_SYM(cuMemGetInfo_v2);
  WC_SYM(cuMemAlloc_v2);
  WC_SYM(cuMemFree_v2);
  WC_SYM(cuMemHostAlloc);
  WC_SYM(cuMemFreeHost);
  WC_SYM(cuMemcpyHtoDAsync_v2);
  WC_SYM(cuMemcpyDtoHAsync_v2);
  WC_SYM(cuMemcpyDtoDAsync_v2);
  WC_SYM(cuMemsetD8Async);
  WC_SYM(cuStreamCreate);
  WC_SYM(cuStreamDestroy_v2);
  WC_SYM(cuStreamQuery);
  WC_SYM(cuStreamWaitEvent);
  WC_SYM(cuEventCreate);
  WC_SYM(cuEventRecord);
  WC_SYM(cuEventQuery);
  WC_SYM(cuEventDestroy_v2);
  WC_SYM(cuIpcGetMemHandle);
  WC_SYM(cuIpcOpenMemHandle_v2);
  WC_SYM(cuIpcCloseMemHandle);
#undef WC_SYM
  wc_cuda = t;
  return 0;
}
