// fakecuda.c is a stand-in for libcuda.so.1 that tests build and load on
// machines without a GPU, to check the cgo layer of package gpu: the
// handles, arguments and by-value structs that cross it. "Device" memory
// is host memory, every copy is a memcpy done at once, and the one kernel
// it runs is wc_gather. It refuses what the real driver would refuse and a
// careless binding might do: a call without the context current, a handle
// it did not make, flags the package does not use, a launch whose grid does
// not match its arguments. It is test data, never shipped.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
  OK = 0,
  INVALID_VALUE = 1,
  INVALID_DEVICE = 101,
  INVALID_CONTEXT = 201,
  INVALID_PTX = 218,
  INVALID_HANDLE = 400,
  NOT_FOUND = 500,
};

enum { STREAM = 0x57524d31, EVENT = 0x45564e31, MODULE = 0x4d4f4431, GATHER = 0x47415431 };

typedef struct {
  unsigned magic;
  int gather; // a module: its image has the wc_gather entry
  int timed;  // an event created without CU_EVENT_DISABLE_TIMING
  double at;  // a timed event: the stand-in's clock when last recorded, in ms
} object;

static double clock_ms; // advances 1 ms at each recording of a timed event

static void *make(unsigned magic) {
  object *o = calloc(1, sizeof(object));
  o->magic = magic;
  return o;
}

static int is(const void *p, unsigned magic) { return p != NULL && ((const object *)p)->magic == magic; }

static CUresult drop(void *p, unsigned magic) {
  if (!is(p, magic))
    return INVALID_HANDLE;
  ((object *)p)->magic = 0;
  free(p);
  return OK;
}

static int primary;       // the one device's primary context
static __thread void *current; // the calling thread's current context

#define NEED_CTX()         \
  if (current != &primary) \
  return INVALID_CONTEXT
#define NEED_STREAM(s)         \
  if (s != NULL && !is(s, STREAM)) \
  return INVALID_HANDLE

CUresult cuInit(unsigned flags) { return flags == 0 ? OK : INVALID_VALUE; }
CUresult cuDriverGetVersion(int *v) {
  *v = 13000;
  return OK;
}
CUresult cuGetErrorName(CUresult e, const char **s) {
  *s = "FAKE_ERROR";
  return OK;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
  *s = e == INVALID_CONTEXT ? "fake: no context current" : "fake: error";
  return OK;
}
CUresult cuDeviceGetCount(int *n) {
  *n = 1;
  return OK;
}
CUresult cuDeviceGet(int *dev, int ordinal) {
  if (ordinal != 0)
    return INVALID_DEVICE;
  *dev = 0;
  return OK;
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
  snprintf(name, len, "Fake CUDA device");
  return dev == 0 ? OK : INVALID_DEVICE;
}
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
  if (attr != 16 || dev != 0) // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return INVALID_VALUE;
  *v = 4;
  return OK;
}
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, int dev) {
  memcpy(uuid, "fake-cuda-uuid-0", 16);
  return dev == 0 ? OK : INVALID_DEVICE;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
  *ctx = &primary;
  return dev == 0 ? OK : INVALID_DEVICE;
}
CUresult cuDevicePrimaryCtxRelease_v2(int dev) { return dev == 0 ? OK : INVALID_DEVICE; }
CUresult cuCtxSetCurrent(void *ctx) {
  if (ctx != NULL && ctx != &primary)
    return INVALID_CONTEXT;
  current = ctx;
  return OK;
}
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
  NEED_CTX();
  *total = (size_t)1 << 30;
  *free = *total / 2;
  return OK;
}
// The live allocations, for cuMemGetAddressRange_v2 (calls come from
// many threads at once).
typedef struct alloc {
  CUdeviceptr p;
  size_t n;
  unsigned long long id; // CU_POINTER_ATTRIBUTE_BUFFER_ID
  struct alloc *next;
} alloc;
static alloc *allocs;
static unsigned long long next_id = 1;
static pthread_mutex_t allocs_mu = PTHREAD_MUTEX_INITIALIZER;

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  NEED_CTX();
  *p = (CUdeviceptr)(uintptr_t)malloc(n);
  alloc *a = malloc(sizeof(alloc));
  a->p = *p, a->n = n;
  pthread_mutex_lock(&allocs_mu);
  a->id = next_id++;
  a->next = allocs;
  allocs = a;
  pthread_mutex_unlock(&allocs_mu);
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  NEED_CTX();
  CUresult r = INVALID_VALUE; // not an allocation's start
  pthread_mutex_lock(&allocs_mu);
  for (alloc **a = &allocs; *a != NULL; a = &(*a)->next)
    if ((*a)->p == p) {
      alloc *dead = *a;
      *a = dead->next;
      free(dead);
      free((void *)(uintptr_t)p);
      r = OK;
      break;
    }
  pthread_mutex_unlock(&allocs_mu);
  return r;
}
// find returns the live allocation that holds p, or NULL; allocs_mu is held.
static alloc *find(CUdeviceptr p) {
  for (alloc *a = allocs; a != NULL; a = a->next)
    if (p >= a->p && p < a->p + a->n)
      return a;
  return NULL;
}
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  NEED_CTX();
  if (attr != 7) // CU_POINTER_ATTRIBUTE_BUFFER_ID
    return INVALID_VALUE;
  pthread_mutex_lock(&allocs_mu);
  alloc *a = find(p);
  if (a != NULL)
    *(unsigned long long *)data = a->id;
  pthread_mutex_unlock(&allocs_mu);
  return a != NULL ? OK : INVALID_VALUE;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  NEED_CTX();
  pthread_mutex_lock(&allocs_mu);
  alloc *a = find(p);
  if (a != NULL)
    *base = a->p, *size = a->n;
  pthread_mutex_unlock(&allocs_mu);
  return a != NULL ? OK : NOT_FOUND;
}
CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags) {
  NEED_CTX();
  if (flags != 3) // PORTABLE | DEVICEMAP
    return INVALID_VALUE;
  *pp = malloc(n);
  return OK;
}
CUresult cuMemFreeHost(void *p) {
  NEED_CTX();
  free(p);
  return OK;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  memcpy((void *)(uintptr_t)dst, src, n);
  return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  memcpy(dst, (void *)(uintptr_t)src, n);
  return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
  return OK;
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
  return OK;
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  memset((void *)(uintptr_t)dst, v, n);
  return OK;
}
CUresult cuStreamCreate(void **s, unsigned flags) {
  NEED_CTX();
  if (flags != 1) // CU_STREAM_NON_BLOCKING
    return INVALID_VALUE;
  *s = make(STREAM);
  return OK;
}
CUresult cuStreamDestroy_v2(void *s) {
  NEED_CTX();
  return drop(s, STREAM);
}
CUresult cuStreamQuery(void *s) {
  NEED_CTX();
  return is(s, STREAM) ? OK : INVALID_HANDLE;
}
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
  NEED_CTX();
  return is(s, STREAM) && is(e, EVENT) && flags == 0 ? OK : INVALID_HANDLE;
}
CUresult cuEventCreate(void **e, unsigned flags) {
  NEED_CTX();
  if (flags != 2 && flags != 0) // CU_EVENT_DISABLE_TIMING, or a timed event
    return INVALID_VALUE;
  *e = make(EVENT);
  ((object *)*e)->timed = flags == 0;
  return OK;
}
CUresult cuEventRecord(void *e, void *s) {
  NEED_CTX();
  if (!is(e, EVENT) || !is(s, STREAM))
    return INVALID_HANDLE;
  if (((object *)e)->timed)
    ((object *)e)->at = ++clock_ms;
  return OK;
}
CUresult cuEventElapsedTime_v2(float *ms, void *start, void *end) {
  NEED_CTX();
  if (!is(start, EVENT) || !is(end, EVENT) || !((object *)start)->timed || !((object *)end)->timed)
    return INVALID_HANDLE;
  *ms = (float)(((object *)end)->at - ((object *)start)->at);
  return OK;
}
CUresult cuEventQuery(void *e) {
  NEED_CTX();
  return is(e, EVENT) ? OK : INVALID_HANDLE;
}
CUresult cuEventDestroy_v2(void *e) {
  NEED_CTX();
  return drop(e, EVENT);
}

// An IPC handle here is "fakeipc", the address, then bytes 16..63 = i.
typedef struct {
  unsigned char b[64];
} handle;

CUresult cuIpcGetMemHandle(handle *h, CUdeviceptr p) {
  NEED_CTX();
  memcpy(h->b, "fakeipc", 8);
  memcpy(h->b + 8, &p, 8);
  for (int i = 16; i < 64; i++)
    h->b[i] = (unsigned char)i;
  return OK;
}
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, handle h, unsigned flags) {
  NEED_CTX();
  if (flags != 1 || memcmp(h.b, "fakeipc", 8) != 0) // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    return INVALID_VALUE;
  for (int i = 16; i < 64; i++)
    if (h.b[i] != i)
      return INVALID_VALUE;
  memcpy(p, h.b + 8, 8);
  return OK;
}
CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  NEED_CTX();
  return p != 0 ? OK : INVALID_VALUE;
}

typedef struct {
  int srcAccessOrder;
  int hints[4];
  unsigned flags;
} attributes;

CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, attributes *attrs,
                               size_t *attrsIdxs, size_t numAttrs, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  if (numAttrs != 1 || attrsIdxs[0] != 0 || attrs[0].srcAccessOrder != 1 || attrs[0].flags != 0)
    return INVALID_VALUE;
  for (size_t i = 0; i < count; i++)
    memmove((void *)(uintptr_t)dsts[i], (void *)(uintptr_t)srcs[i], sizes[i]);
  return OK;
}

CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *opts, void **vals) {
  NEED_CTX();
  if (n != 2 || opts[0] != 5 || opts[1] != 6) // the error log buffer and its size
    return INVALID_VALUE;
  if (strstr(image, ".version") == NULL) {
    snprintf(vals[0], (size_t)(uintptr_t)vals[1], "fake ptxas: no .version directive");
    return INVALID_PTX;
  }
  object *o = make(MODULE);
  o->gather = strstr(image, ".entry wc_gather(") != NULL;
  *m = o;
  return OK;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  NEED_CTX();
  if (!is(m, MODULE))
    return INVALID_HANDLE;
  if (strcmp(name, "wc_gather") != 0 || !((object *)m)->gather)
    return NOT_FOUND;
  *f = make(GATHER);
  return OK;
}
CUresult cuModuleUnload(void *m) {
  NEED_CTX();
  return drop(m, MODULE);
}

// cuLaunchKernel runs wc_gather(ranges, count): count ranges of (source,
// destination, length), one block of 256 threads each.
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *s, void **params, void **extra) {
  NEED_CTX();
  NEED_STREAM(s);
  if (!is(f, GATHER))
    return INVALID_HANDLE;
  CUdeviceptr ranges = *(CUdeviceptr *)params[0];
  unsigned count = *(unsigned *)params[1];
  if (gx != count || gy != 1 || gz != 1 || bx != 256 || by != 1 || bz != 1 || shared != 0 || extra != NULL)
    return INVALID_VALUE;
  const uint64_t *r = (const uint64_t *)(uintptr_t)ranges;
  for (unsigned i = 0; i < count; i++)
    memmove((void *)(uintptr_t)r[3 * i + 1], (void *)(uintptr_t)r[3 * i], r[3 * i + 2]);
  return OK;
}
