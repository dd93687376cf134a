// fakecuda.c is a stand-in for libcuda.so.1 that tests build and load on
// machines without a GPU, to check the cgo layer of package gpu: the
// handles, arguments and by-value structs that cross it. "Device" memory
// is host memory, every copy is a memcpy done at once, and the one kernel
// it runs is wc_gather. It refuses what the real driver would refuse and a
// careless binding might do: a call without the context current, a handle
// it did not make, flags the package does not use, a launch whose grid does
// not match its arguments. Where the driver returns an error rather than
// crash, so does it: a copy from or into freed memory (see mem_mu), a
// handle already destroyed (see objects_mu). It is test data, never
// shipped.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
  ILLEGAL_ADDRESS = 700,
};

enum { STREAM = 0x57524d31, EVENT = 0x45564e31, MODULE = 0x4d4f4431, GATHER = 0x47415431, RAISE = 0x52415331 };

// An object is a stream, event, module or function. The live ones are
// kept in a list, so that a handle is checked by looking it up, never by
// reading memory that may have been freed: a handle destroyed on one
// thread and used on another gets INVALID_HANDLE, as from the driver.
// objects_mu guards the list, the objects and clock_ms.
typedef struct object {
  unsigned magic;
  int gather; // a module: its image has the wc_gather entry
  int raise;  // a module: its image has the wc_raise entry
  int timed;  // an event created without CU_EVENT_DISABLE_TIMING
  double at;  // a timed event: the stand-in's clock when last recorded, in ms
  struct object *next;
} object;

static object *objects;
static pthread_mutex_t objects_mu = PTHREAD_MUTEX_INITIALIZER;
static double clock_ms; // advances 1 ms at each recording of a timed event

static void *make(unsigned magic) {
  object *o = calloc(1, sizeof(object));
  o->magic = magic;
  pthread_mutex_lock(&objects_mu);
  o->next = objects;
  objects = o;
  pthread_mutex_unlock(&objects_mu);
  return o;
}

// is reports whether p is a live object of kind magic; objects_mu is held.
static int is(const void *p, unsigned magic) {
  for (object *o = objects; o != NULL; o = o->next)
    if (o == p)
      return o->magic == magic;
  return 0;
}

// alive is is for a caller that does not hold objects_mu.
static int alive(const void *p, unsigned magic) {
  pthread_mutex_lock(&objects_mu);
  int ok = is(p, magic);
  pthread_mutex_unlock(&objects_mu);
  return ok;
}

static CUresult drop(void *p, unsigned magic) {
  CUresult r = INVALID_HANDLE;
  pthread_mutex_lock(&objects_mu);
  for (object **o = &objects; *o != NULL; o = &(*o)->next)
    if (*o == p) {
      if ((*o)->magic == magic) {
        *o = ((object *)p)->next;
        free(p);
        r = OK;
      }
      break;
    }
  pthread_mutex_unlock(&objects_mu);
  return r;
}

static int primary;             // the one device's primary context
static __thread void *current; // the calling thread's current context
static int faulted;            // a launch touched memory outside live allocations: the context is lost

#define NEED_CTX()                                 \
  if (current != &primary)                         \
    return INVALID_CONTEXT;                        \
  if (__atomic_load_n(&faulted, __ATOMIC_RELAXED)) \
    return ILLEGAL_ADDRESS
#define NEED_STREAM(s)                \
  if (s != NULL && !alive(s, STREAM)) \
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
  if (dev != 0)
    return INVALID_VALUE;
  switch (attr) {
  case 16: // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    *v = 4;
    return OK;
  case 122: // CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
    // This stand-in cannot hold work back (its waits are refused unless
    // met), so it says yes only to tests that queue met waits alone and
    // set FAKECUDA_WAIT64=1; the others then take no turns.
    *v = getenv("FAKECUDA_WAIT64") != NULL && strcmp(getenv("FAKECUDA_WAIT64"), "1") == 0;
    return OK;
  case 133: // CU_DEVICE_ATTRIBUTE_MPS_ENABLED: as FAKECUDA_MPS says
    if (!getenv("FAKECUDA_MPS"))
      return INVALID_VALUE; // a driver too old to know the attribute
    *v = strcmp(getenv("FAKECUDA_MPS"), "1") == 0;
    return OK;
  }
  return INVALID_VALUE;
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
// The live allocations: device memory (cuMemAlloc_v2) and pinned host
// memory (cuMemHostAlloc). Calls come from many threads at once. Each
// copy, memset and launch holds mem_mu for reading while it checks that the
// device side of each of its ranges lies in one live allocation and moves
// the bytes, and a free holds it for writing: so a free never pulls memory
// from under a copy, and a copy after the free (from a buffer its owner
// freed while another thread still reads it) fails with INVALID_VALUE, as
// the driver refuses an address in no allocation, instead of touching
// freed memory.
typedef struct alloc {
  CUdeviceptr p;
  size_t n;
  int host;              // pinned host memory
  unsigned long long id; // CU_POINTER_ATTRIBUTE_BUFFER_ID
  struct alloc *next;
} alloc;
static alloc *allocs;
static unsigned long long next_id = 1;
static pthread_rwlock_t mem_mu = PTHREAD_RWLOCK_INITIALIZER;

static void track(void *p, size_t n, int host) {
  alloc *a = malloc(sizeof(alloc));
  a->p = (CUdeviceptr)(uintptr_t)p, a->n = n, a->host = host;
  pthread_rwlock_wrlock(&mem_mu);
  a->id = next_id++;
  a->next = allocs;
  allocs = a;
  pthread_rwlock_unlock(&mem_mu);
}

// untrack frees the live allocation of its kind that starts at p, once
// every copy in flight has finished; INVALID_VALUE where there is none.
static CUresult untrack(CUdeviceptr p, int host) {
  CUresult r = INVALID_VALUE;
  pthread_rwlock_wrlock(&mem_mu);
  for (alloc **a = &allocs; *a != NULL; a = &(*a)->next)
    if ((*a)->p == p && (*a)->host == host) {
      alloc *dead = *a;
      *a = dead->next;
      free(dead);
      free((void *)(uintptr_t)p);
      r = OK;
      break;
    }
  pthread_rwlock_unlock(&mem_mu);
  return r;
}

// find returns the live device allocation that holds p, or NULL; mem_mu
// is held.
static alloc *find(CUdeviceptr p) {
  for (alloc *a = allocs; a != NULL; a = a->next)
    if (!a->host && p >= a->p && p < a->p + a->n)
      return a;
  return NULL;
}

// live reports whether n bytes at p lie in one live allocation, of device
// memory or of pinned host memory (mapped, so a device address too);
// mem_mu is held.
static int live(CUdeviceptr p, size_t n) {
  if (n == 0)
    return 1;
  for (alloc *a = allocs; a != NULL; a = a->next)
    if (p >= a->p && p < a->p + a->n)
      return n <= a->p + a->n - p;
  return 0;
}

// The sides of a copy: HOST, any host memory (not checked: the driver
// takes pageable memory), or LIVE, a device address, which must be live.
enum { HOST, LIVE };

// move copies n bytes from src to dst, each of side HOST or LIVE, and
// returns INVALID_VALUE, moving nothing, where a LIVE side is not.
static CUresult move(CUdeviceptr dst, int ds, CUdeviceptr src, int ss, size_t n) {
  pthread_rwlock_rdlock(&mem_mu);
  CUresult r = (ds == HOST || live(dst, n)) && (ss == HOST || live(src, n)) ? OK : INVALID_VALUE;
  if (r == OK)
    memmove((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n);
  pthread_rwlock_unlock(&mem_mu);
  return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
  NEED_CTX();
  void *m = malloc(n);
  track(m, n, 0);
  *p = (CUdeviceptr)(uintptr_t)m;
  return OK;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  NEED_CTX();
  return untrack(p, 0); // INVALID_VALUE: not an allocation's start
}
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
  NEED_CTX();
  if (attr != 7) // CU_POINTER_ATTRIBUTE_BUFFER_ID
    return INVALID_VALUE;
  pthread_rwlock_rdlock(&mem_mu);
  alloc *a = find(p);
  if (a != NULL)
    *(unsigned long long *)data = a->id;
  pthread_rwlock_unlock(&mem_mu);
  return a != NULL ? OK : INVALID_VALUE;
}
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  NEED_CTX();
  pthread_rwlock_rdlock(&mem_mu);
  alloc *a = find(p);
  if (a != NULL)
    *base = a->p, *size = a->n;
  pthread_rwlock_unlock(&mem_mu);
  return a != NULL ? OK : NOT_FOUND;
}
CUresult cuMemHostAlloc(void **pp, size_t n, unsigned flags) {
  NEED_CTX();
  if (flags != 3) // PORTABLE | DEVICEMAP
    return INVALID_VALUE;
  *pp = malloc(n);
  track(*pp, n, 1);
  return OK;
}
CUresult cuMemFreeHost(void *p) {
  NEED_CTX();
  return untrack((CUdeviceptr)(uintptr_t)p, 1);
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  return move(dst, LIVE, (CUdeviceptr)(uintptr_t)src, HOST, n);
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  return move((CUdeviceptr)(uintptr_t)dst, HOST, src, LIVE, n);
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  return move(dst, LIVE, src, LIVE, n);
}
CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  return move(dst, LIVE, src, LIVE, n);
}
CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, void *s) {
  NEED_CTX();
  NEED_STREAM(s);
  pthread_rwlock_rdlock(&mem_mu);
  CUresult r = live(dst, n) ? OK : INVALID_VALUE;
  if (r == OK)
    memset((void *)(uintptr_t)dst, v, n);
  pthread_rwlock_unlock(&mem_mu);
  return r;
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
  return alive(s, STREAM) ? OK : INVALID_HANDLE;
}
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
  NEED_CTX();
  return alive(s, STREAM) && alive(e, EVENT) && flags == 0 ? OK : INVALID_HANDLE;
}
// cuStreamWriteValue32_v2 writes v at once (this stand-in's work has
// always run by the time it is queued), with the flags the package uses:
// 0, CU_STREAM_WRITE_VALUE_DEFAULT.
CUresult cuStreamWriteValue32_v2(void *s, CUdeviceptr addr, uint32_t v, unsigned flags) {
  NEED_CTX();
  NEED_STREAM(s);
  if (flags != 0 || addr % 4 != 0)
    return INVALID_VALUE;
  pthread_rwlock_rdlock(&mem_mu);
  CUresult r = live(addr, 4) ? OK : INVALID_VALUE;
  if (r == OK)
    *(volatile uint32_t *)(uintptr_t)addr = v;
  pthread_rwlock_unlock(&mem_mu);
  return r;
}
// cuStreamWaitValue32_v2 takes only flags 0, CU_STREAM_WAIT_VALUE_GEQ, the
// driver's cyclic comparison. This stand-in cannot hold work back, so it
// refuses (INVALID_VALUE) a wait that is not met when it is queued.
CUresult cuStreamWaitValue32_v2(void *s, CUdeviceptr addr, uint32_t v, unsigned flags) {
  NEED_CTX();
  NEED_STREAM(s);
  if (flags != 0 || addr % 4 != 0)
    return INVALID_VALUE;
  pthread_rwlock_rdlock(&mem_mu);
  CUresult r = live(addr, 4) && (int32_t)(*(volatile uint32_t *)(uintptr_t)addr - v) >= 0 ? OK : INVALID_VALUE;
  pthread_rwlock_unlock(&mem_mu);
  return r;
}
// cuStreamWriteValue64_v2 and cuStreamWaitValue64_v2 are the 32-bit
// ones' over 8-byte words, except that a 64-bit wait not met when it is
// queued may hold the caller (in place of the stream, which this stand-in
// cannot hold back) until another thread meets it: for FAKECUDA_WAIT_MS
// milliseconds at most (0, the default, refuses it at once), so that
// goroutines taking turns through such words run in their order.
CUresult cuStreamWriteValue64_v2(void *s, CUdeviceptr addr, uint64_t v, unsigned flags) {
  NEED_CTX();
  NEED_STREAM(s);
  if (flags != 0 || addr % 8 != 0)
    return INVALID_VALUE;
  pthread_rwlock_rdlock(&mem_mu);
  CUresult r = live(addr, 8) ? OK : INVALID_VALUE;
  if (r == OK)
    __atomic_store_n((uint64_t *)(uintptr_t)addr, v, __ATOMIC_RELAXED);
  pthread_rwlock_unlock(&mem_mu);
  return r;
}
CUresult cuStreamWaitValue64_v2(void *s, CUdeviceptr addr, uint64_t v, unsigned flags) {
  NEED_CTX();
  NEED_STREAM(s);
  if (flags != 0 || addr % 8 != 0)
    return INVALID_VALUE;
  const char *env = getenv("FAKECUDA_WAIT_MS");
  long polls = env ? atol(env) * 10 : 0; // one poll per 100 us
  for (;;) {
    pthread_rwlock_rdlock(&mem_mu);
    int ok = live(addr, 8);
    int met = ok && (int64_t)(__atomic_load_n((uint64_t *)(uintptr_t)addr, __ATOMIC_ACQUIRE) - v) >= 0;
    pthread_rwlock_unlock(&mem_mu);
    if (met)
      return OK;
    if (!ok || polls-- <= 0)
      return INVALID_VALUE;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
}
CUresult cuEventCreate(void **e, unsigned flags) {
  NEED_CTX();
  if (flags != 2 && flags != 0) // CU_EVENT_DISABLE_TIMING, or a timed event
    return INVALID_VALUE;
  object *o = make(EVENT);
  pthread_mutex_lock(&objects_mu);
  o->timed = flags == 0;
  pthread_mutex_unlock(&objects_mu);
  *e = o;
  return OK;
}
CUresult cuEventRecord(void *e, void *s) {
  NEED_CTX();
  CUresult r = INVALID_HANDLE;
  pthread_mutex_lock(&objects_mu);
  if (is(e, EVENT) && is(s, STREAM)) {
    if (((object *)e)->timed)
      ((object *)e)->at = ++clock_ms;
    r = OK;
  }
  pthread_mutex_unlock(&objects_mu);
  return r;
}
CUresult cuEventElapsedTime_v2(float *ms, void *start, void *end) {
  NEED_CTX();
  CUresult r = INVALID_HANDLE;
  pthread_mutex_lock(&objects_mu);
  if (is(start, EVENT) && is(end, EVENT) && ((object *)start)->timed && ((object *)end)->timed) {
    *ms = (float)(((object *)end)->at - ((object *)start)->at);
    r = OK;
  }
  pthread_mutex_unlock(&objects_mu);
  return r;
}
CUresult cuEventQuery(void *e) {
  NEED_CTX();
  return alive(e, EVENT) ? OK : INVALID_HANDLE;
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
  CUresult r = OK;
  pthread_rwlock_rdlock(&mem_mu);
  for (size_t i = 0; i < count && r == OK; i++)
    if (!live(dsts[i], sizes[i]) || !live(srcs[i], sizes[i]))
      r = INVALID_VALUE; // the batch is refused whole
  for (size_t i = 0; i < count && r == OK; i++)
    memmove((void *)(uintptr_t)dsts[i], (void *)(uintptr_t)srcs[i], sizes[i]);
  pthread_rwlock_unlock(&mem_mu);
  return r;
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
  pthread_mutex_lock(&objects_mu);
  o->gather = strstr(image, ".entry wc_gather(") != NULL;
  o->raise = strstr(image, ".entry wc_raise(") != NULL;
  pthread_mutex_unlock(&objects_mu);
  *m = o;
  return OK;
}
CUresult cuModuleGetFunction(void **f, void *m, const char *name) {
  NEED_CTX();
  pthread_mutex_lock(&objects_mu);
  int raise = strcmp(name, "wc_raise") == 0;
  CUresult r = !is(m, MODULE)                                                       ? INVALID_HANDLE
               : raise ? (((object *)m)->raise ? OK : NOT_FOUND)
               : strcmp(name, "wc_gather") != 0 || !((object *)m)->gather ? NOT_FOUND
                                                                          : OK;
  pthread_mutex_unlock(&objects_mu);
  if (r == OK)
    *f = make(raise ? RAISE : GATHER);
  return r;
}
CUresult cuModuleUnload(void *m) {
  NEED_CTX();
  return drop(m, MODULE);
}

// launch_raise runs wc_raise(word, v), one thread: the word becomes the
// larger of itself and v.
static CUresult launch_raise(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                             unsigned shared, void **params, void **extra) {
  if (gx != 1 || gy != 1 || gz != 1 || bx != 1 || by != 1 || bz != 1 || shared != 0 || extra != NULL)
    return INVALID_VALUE;
  CUdeviceptr word = *(CUdeviceptr *)params[0];
  uint64_t v = *(uint64_t *)params[1];
  pthread_rwlock_rdlock(&mem_mu);
  int ok = word % 8 == 0 && live(word, 8);
  if (ok) {
    uint64_t *w = (uint64_t *)(uintptr_t)word;
    uint64_t old = __atomic_load_n(w, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(w, &old, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      ;
  }
  pthread_rwlock_unlock(&mem_mu);
  if (!ok) {
    __atomic_store_n(&faulted, 1, __ATOMIC_RELAXED);
    return ILLEGAL_ADDRESS;
  }
  return OK;
}

// cuLaunchKernel runs wc_gather(ranges, count): count ranges of (source,
// destination, length), one block of 256 threads each. A kernel that reads
// or writes outside live memory faults, and the fault loses the context,
// as on the GPU: this call and every later one return ILLEGAL_ADDRESS (the
// driver reports it at the next call that waits).
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void *s, void **params, void **extra) {
  NEED_CTX();
  NEED_STREAM(s);
  if (alive(f, RAISE))
    return launch_raise(gx, gy, gz, bx, by, bz, shared, params, extra);
  if (!alive(f, GATHER))
    return INVALID_HANDLE;
  CUdeviceptr ranges = *(CUdeviceptr *)params[0];
  unsigned count = *(unsigned *)params[1];
  if (gx != count || gy != 1 || gz != 1 || bx != 256 || by != 1 || bz != 1 || shared != 0 || extra != NULL)
    return INVALID_VALUE;
  const uint64_t *r = (const uint64_t *)(uintptr_t)ranges;
  pthread_rwlock_rdlock(&mem_mu);
  int ok = live(ranges, 24 * (size_t)count);
  for (unsigned i = 0; i < count && ok; i++)
    ok = live(r[3 * i + 1], r[3 * i + 2]) && live(r[3 * i], r[3 * i + 2]);
  for (unsigned i = 0; i < count && ok; i++)
    memmove((void *)(uintptr_t)r[3 * i + 1], (void *)(uintptr_t)r[3 * i], r[3 * i + 2]);
  pthread_rwlock_unlock(&mem_mu);
  if (!ok) {
    __atomic_store_n(&faulted, 1, __ATOMIC_RELAXED);
    return ILLEGAL_ADDRESS;
  }
  return OK;
}
