//go:build cgo

// nccl_shim.c opens libnccl and fills the dispatch table declared in
// nccl_shim.h. It is compiled only with cgo (the build constraint above):
// without it the package's Go twin, library_nocgo.go, stands in.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

#include "nccl_shim.h"

wc_nccl_table wc_nccl;

int wc_nccl_load(const char *path, char *err, size_t errlen, char *loaded, size_t loadedlen) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    const char *msg = dlerror();
    snprintf(err, errlen, "%s", msg ? msg : "dlopen failed");
    return -1;
  }
  wc_nccl_table t = {0};
  t.lib = h;
#define WC_SYM(name) t.name = (__typeof__(t.name))dlsym(h, #name)
  WC_SYM(ncclGetVersion);
  WC_SYM(ncclGetUniqueId);
  WC_SYM(ncclCommInitRankConfig);
  WC_SYM(ncclCommGetAsyncError);
  WC_SYM(ncclCommFinalize);
  WC_SYM(ncclCommDestroy);
  WC_SYM(ncclCommAbort);
  WC_SYM(ncclBroadcast);
  WC_SYM(ncclGetErrorString);
  WC_SYM(ncclGetLastError);
#undef WC_SYM
  if (t.ncclGetVersion == NULL) {
    snprintf(err, errlen, "%s has no ncclGetVersion: not an NCCL library", path);
    dlclose(h);
    return -1;
  }
  Dl_info info;
  if (dladdr((void *)t.ncclGetVersion, &info) != 0 && info.dli_fname != NULL) {
    snprintf(loaded, loadedlen, "%s", info.dli_fname);
  } else {
    snprintf(loaded, loadedlen, "%s", path);
  }
  wc_nccl = t;
  return 0;
}
