// nccl_shim.h is a hand-written minimal subset of nccl.h: only the types,
// constants and prototypes this package uses. No NCCL or CUDA headers are
// needed to build; libnccl.so.2 is opened at run time and its functions are
// looked up into the dispatch table wc_nccl, both through package
// internal/dl (openLibrary in library_cgo.go). Every
// call goes through a static inline wc_ shim that returns
// WC_NCCL_FUNCTION_NOT_FOUND when the function is missing (or no library was
// loaded). library_cgo.go, the package's only cgo file, is the only one that
// includes this header: it wraps each shim in a Go function of Go types.
#ifndef WEIGHTCAST_NCCL_SHIM_H
#define WEIGHTCAST_NCCL_SHIM_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef int ncclResult_t; // an enum in nccl.h
typedef int ncclDataType_t;
typedef struct ncclComm *ncclComm_t;
typedef struct CUstream_st *cudaStream_t; // the same object as a CUstream

#define WC_NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[WC_NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

enum {
  WC_ncclSuccess = 0,
  WC_ncclInProgress = 7,
  // Not an NCCL code: the shim's answer when a function pointer is NULL.
  WC_NCCL_FUNCTION_NOT_FOUND = 0x7fff0001,
  WC_ncclUint8 = 1,
};

// ncclConfig_t as NCCL 2.28 lays it out (struct ncclConfig_v22800). NCCL
// copies min(size, its own sizeof) bytes and ignores fields newer than the
// version stamped in, so this prefix works with 2.28 and later libraries.
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
} ncclConfig_t;

#define WC_NCCL_CONFIG_UNDEF_INT INT_MIN
#define WC_NCCL_API_MAGIC 0xcafebeef
#define WC_NCCL_CONFIG_VERSION 22803 // NCCL_VERSION(2, 28, 3)

// NCCL_CONFIG_INITIALIZER for the layout above: every field undefined, so
// NCCL applies its defaults.
#define WC_NCCL_CONFIG_INITIALIZER                                                                           \
  {                                                                                                          \
    sizeof(ncclConfig_t), WC_NCCL_API_MAGIC, WC_NCCL_CONFIG_VERSION, WC_NCCL_CONFIG_UNDEF_INT,             \
        WC_NCCL_CONFIG_UNDEF_INT, WC_NCCL_CONFIG_UNDEF_INT, WC_NCCL_CONFIG_UNDEF_INT, NULL,                  \
        WC_NCCL_CONFIG_UNDEF_INT, WC_NCCL_CONFIG_UNDEF_INT, NULL, WC_NCCL_CONFIG_UNDEF_INT,                  \
        WC_NCCL_CONFIG_UNDEF_INT, WC_NCCL_CONFIG_UNDEF_INT, WC_NCCL_CONFIG_UNDEF_INT,                        \
        WC_NCCL_CONFIG_UNDEF_INT, WC_NCCL_CONFIG_UNDEF_INT                                                   \
  }

// wc_nccl_table holds the NCCL functions found by dlsym; NULL where the
// symbol is missing. Each field is named after its symbol and is nothing
// but a function pointer: dl.Fill takes the names from the fields, so the
// table is its own list of symbols.
typedef struct {
  ncclResult_t (*ncclGetVersion)(int *version);
  ncclResult_t (*ncclGetUniqueId)(ncclUniqueId *id);
  ncclResult_t (*ncclCommInitRankConfig)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                         ncclConfig_t *config);
  ncclResult_t (*ncclCommGetAsyncError)(ncclComm_t comm, ncclResult_t *asyncError);
  ncclResult_t (*ncclCommFinalize)(ncclComm_t comm);
  ncclResult_t (*ncclCommDestroy)(ncclComm_t comm);
  ncclResult_t (*ncclCommAbort)(ncclComm_t comm);
  ncclResult_t (*ncclBroadcast)(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                int root, ncclComm_t comm, cudaStream_t stream);
  const char *(*ncclGetErrorString)(ncclResult_t result);
  const char *(*ncclGetLastError)(ncclComm_t comm);
} wc_nccl_table;

extern wc_nccl_table wc_nccl;

#define WC_NEED(fn)       \
  if (wc_nccl.fn == NULL) \
  return WC_NCCL_FUNCTION_NOT_FOUND

// A communicator's handle lives in a slot of C memory, which NCCL writes
// during init and which stays put for the communicator's life; Go keeps the
// slot's address as an integer (uintptr_t) and the shims read the handle
// from it.
static inline uintptr_t wc_comm_slot_new(void) { return (uintptr_t)calloc(1, sizeof(ncclComm_t)); }
static inline void wc_comm_slot_free(uintptr_t slot) { free((void *)slot); }
#define WC_COMM(slot) (*(ncclComm_t *)(slot))
static inline int wc_comm_slot_set(uintptr_t slot) { return WC_COMM(slot) != NULL; }

static inline ncclResult_t wc_ncclGetVersion(int *v) {
  WC_NEED(ncclGetVersion);
  return wc_nccl.ncclGetVersion(v);
}

static inline ncclResult_t wc_ncclGetUniqueId(ncclUniqueId *id) {
  WC_NEED(ncclGetUniqueId);
  return wc_nccl.ncclGetUniqueId(id);
}

// wc_ncclCommInitRankConfig takes the 128-byte unique id by pointer and
// passes it by value, so that the C compiler applies the calling convention.
// The config lives on this stack frame: NCCL copies it before returning.
static inline ncclResult_t wc_ncclCommInitRankConfig(uintptr_t slot, int nranks, const ncclUniqueId *id, int rank,
                                                     int blocking) {
  WC_NEED(ncclCommInitRankConfig);
  ncclConfig_t config = WC_NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking;
  return wc_nccl.ncclCommInitRankConfig(&WC_COMM(slot), nranks, *id, rank, &config);
}

static inline ncclResult_t wc_ncclCommGetAsyncError(uintptr_t slot, ncclResult_t *state) {
  WC_NEED(ncclCommGetAsyncError);
  return wc_nccl.ncclCommGetAsyncError(WC_COMM(slot), state);
}

static inline ncclResult_t wc_ncclCommFinalize(uintptr_t slot) {
  WC_NEED(ncclCommFinalize);
  return wc_nccl.ncclCommFinalize(WC_COMM(slot));
}

static inline ncclResult_t wc_ncclCommDestroy(uintptr_t slot) {
  WC_NEED(ncclCommDestroy);
  return wc_nccl.ncclCommDestroy(WC_COMM(slot));
}

static inline ncclResult_t wc_ncclCommAbort(uintptr_t slot) {
  WC_NEED(ncclCommAbort);
  return wc_nccl.ncclCommAbort(WC_COMM(slot));
}

// wc_ncclBroadcast takes device addresses and the stream as integers.
static inline ncclResult_t wc_ncclBroadcast(uint64_t send, uint64_t recv, size_t count, int root, uintptr_t slot,
                                            uintptr_t stream) {
  WC_NEED(ncclBroadcast);
  return wc_nccl.ncclBroadcast((const void *)(uintptr_t)send, (void *)(uintptr_t)recv, count, WC_ncclUint8, root,
                               WC_COMM(slot), (cudaStream_t)stream);
}

static inline const char *wc_ncclGetErrorString(ncclResult_t r) {
  if (wc_nccl.ncclGetErrorString == NULL)
    return NULL;
  return wc_nccl.ncclGetErrorString(r);
}

static inline const char *wc_ncclGetLastError(ncclComm_t comm) {
  if (wc_nccl.ncclGetLastError == NULL)
    return NULL;
  return wc_nccl.ncclGetLastError(comm);
}

#endif
