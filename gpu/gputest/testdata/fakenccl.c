// fakenccl.c is a stand-in for libnccl.so.2 that tests build and load on
// machines without a GPU, beside fakecuda.c, to check the cgo layer of
// package nccl: the 128-byte unique id passed by value, the config's
// layout, the communicator handle and the stream handed over. One rank
// only; the broadcast is a memmove done at once, and a communicator's init
// stays in progress for two polls. It is test data, never shipped.
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SUCCESS = 0, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, IN_PROGRESS = 7 };
enum { COMM = 0x434f4d31, STREAM = 0x57524d31 }; // STREAM: fakecuda.c's streams

typedef struct {
  char internal[128];
} ncclUniqueId;

// ncclConfig_t of NCCL 2.28, as nccl_shim.h lays it out.
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize, minCTAs, maxCTAs;
  const char *netName;
  int splitShare, trafficClass;
  const char *commName;
  int collnetEnable, CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched;
} config;

typedef struct {
  unsigned magic;
  int polls; // ncclCommGetAsyncError answers in progress this many more times
} comm;

static const char *last = "";

int ncclGetVersion(int *v) {
  *v = 22803;
  return SUCCESS;
}

int ncclGetUniqueId(ncclUniqueId *id) {
  for (int i = 0; i < 128; i++)
    id->internal[i] = (char)(i * 7 + 3);
  return SUCCESS;
}

int ncclCommInitRankConfig(comm **c, int nranks, ncclUniqueId id, int rank, config *cfg) {
  for (int i = 0; i < 128; i++)
    if (id.internal[i] != (char)(i * 7 + 3)) {
      last = "fake: the unique id arrived changed";
      return INVALID_ARGUMENT;
    }
  if (cfg->size != sizeof(config) || cfg->magic != 0xcafebeef || cfg->version != 22803 || cfg->blocking != 0 ||
      cfg->minCTAs != INT_MIN || cfg->netName != NULL || cfg->nvlinkCentricSched != INT_MIN) {
    last = "fake: the config is not a non-blocking NCCL 2.28 config";
    return INVALID_ARGUMENT;
  }
  if (nranks != 1 || rank != 0) {
    last = "fake: one rank only";
    return INVALID_USAGE;
  }
  comm *o = calloc(1, sizeof(comm));
  o->magic = COMM;
  o->polls = 2;
  *c = o;
  return IN_PROGRESS;
}

static int valid(const comm *c) { return c != NULL && c->magic == COMM; }

int ncclCommGetAsyncError(comm *c, int *state) {
  if (!valid(c))
    return INVALID_ARGUMENT;
  *state = c->polls > 0 ? IN_PROGRESS : SUCCESS;
  if (c->polls > 0)
    c->polls--;
  return SUCCESS;
}

int ncclBroadcast(const void *send, void *recv, size_t count, int datatype, int root, comm *c, void *stream) {
  if (!valid(c) || datatype != 1 || root != 0) // ncclUint8
    return INVALID_ARGUMENT;
  if (stream == NULL || *(unsigned *)stream != STREAM) {
    last = "fake: not a stream of the fake CUDA driver";
    return INVALID_ARGUMENT;
  }
  memmove(recv, send, count);
  return SUCCESS;
}

static int drop(comm *c) {
  if (!valid(c))
    return INVALID_ARGUMENT;
  c->magic = 0;
  free(c);
  return SUCCESS;
}

int ncclCommFinalize(comm *c) { return valid(c) ? SUCCESS : INVALID_ARGUMENT; }
int ncclCommDestroy(comm *c) { return drop(c); }
int ncclCommAbort(comm *c) { return drop(c); }
const char *ncclGetErrorString(int r) { return "fake"; }
const char *ncclGetLastError(comm *c) { return last; }
