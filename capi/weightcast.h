/*
 * weightcast.h — the C interface of libweightcast.so, the weightcast library
 * (streaming model weights from one rank to many) built with
 * `go build -buildmode=c-shared`. The Python package `weightcast` is ctypes
 * over exactly these calls.
 *
 * Conventions
 *   - Every call returns an int status: WC_OK (0), WC_AGAIN or WC_DONE (> 0,
 *     not failures), or a WC_ERR_* code (< 0). After a negative status,
 *     wc_last_error() on the same thread gives the Go error's text (it names
 *     the group, the rank and the bucket where they apply).
 *   - Senders and receivers are int64 handles, never pointers. A handle that
 *     was closed, or never returned by an open call, gives WC_ERR_CLOSED; it
 *     never crashes. Handles are not reused.
 *   - No Go panic crosses this boundary: one is returned as WC_ERR_PANIC with
 *     its text and stack.
 *   - Calls on one handle come from one thread at a time, except wc_abort and
 *     wc_close, which may come from any thread at any time.
 *   - Long waits are sliced: wc_wait and wc_next wait at most timeout_ms and
 *     return WC_AGAIN, so that a caller can handle signals (Ctrl-C) between
 *     calls and then call wc_abort.
 *
 * Memory ownership
 *   - Strings and arrays passed in (configuration, descriptors, names, dims)
 *     are read during the call and not kept.
 *   - Tensor bytes passed to wc_send (wc_tensor.data) stay the caller's: they
 *     must stay allocated and unchanged until wc_wait reports the round's end
 *     (WC_OK or an error). Device tensors are read in place, after an event
 *     recorded on wc_tensor.stream, never after a device-wide synchronize.
 *   - A wc_batch filled by wc_next, and the tensors, names and dims it points
 *     to, are the library's (C memory): valid until the next wc_next,
 *     wc_abort or wc_close on the handle. The views' bytes (wc_tensor.data of
 *     a batch) are the library's bucket memory, valid until the next wc_next;
 *     the bucket is reused only after an event that wc_next records on the
 *     stream it is given has completed, so work the caller queued there on
 *     the views may still be running when wc_next returns.
 *   - The library never keeps a pointer into the caller's memory past a
 *     round, and never hands out Go memory.
 *
 * Why a JSON configuration rather than a C struct: the options grow (a group
 * secret and TLS are coming) without changing this ABI; the caller names only
 * what it sets; unknown keys are refused with a clear error instead of being
 * misread from a struct of another version.
 *
 * Why descriptors use offsets into shared name and dims arrays rather than
 * pointers: a caller builds a whole round in three flat buffers, with no
 * allocation per tensor, which keeps the cost per tensor of a Python caller
 * around a microsecond.
 */
#ifndef WEIGHTCAST_H
#define WEIGHTCAST_H

#include <stdint.h>

#define WC_OK 0
#define WC_AGAIN 1 /* not finished within timeout_ms: call again */
#define WC_DONE 2  /* wc_next: the round ended and is committed on every receiver */

#define WC_ERR_OTHER -1     /* a failure the text describes */
#define WC_ERR_CONFIG -2    /* bad configuration or input: change it */
#define WC_ERR_TIMEOUT -3   /* a wait ran past its deadline */
#define WC_ERR_PEER_GONE -4 /* another rank died or left */
#define WC_ERR_CHECKSUM -5  /* a bucket's bytes did not match their checksum */
#define WC_ERR_CLOSED -6    /* closed or unknown handle */
#define WC_ERR_ABORTED -7   /* a rank gave the round up (wc_abort, or a failure the text names) */
#define WC_ERR_PANIC -8     /* a bug in the library: please report the text */

/* wc_tensor.flags */
#define WC_STRIDED 1 /* the elements are not dense in row-major order: refused, naming the tensor */

/* One tensor, 64 bytes: a descriptor passed to wc_send, or a view returned
 * in a wc_batch. */
typedef struct wc_tensor {
	uint64_t data;   /* address of the first byte: host memory, or device memory when device >= 0 */
	uint64_t nbytes; /* byte length */
	uint64_t stream; /* wc_send, device tensors: CUstream their writes were queued on (0: legacy default) */
	int64_t dims;    /* index into the dims array of the first of ndim dimensions */
	int32_t ndim;
	int32_t device;   /* -1: host memory; otherwise the CUDA device ordinal */
	int32_t name;     /* offset into the names array of the name (UTF-8, not NUL-terminated) */
	int32_t name_len; /* its length in bytes */
	int32_t flags;    /* WC_STRIDED */
	char dtype[12];   /* safetensors spelling, NUL-padded: "BF16", "F32", "I64", "BOOL", ... */
} wc_tensor;

/* One received bucket's whole tensors, filled by wc_next. */
typedef struct wc_batch {
	wc_tensor *tensors;
	int64_t n;
	char *names;
	int64_t names_len;
	int64_t *dims;
	int64_t ndims;
	uint64_t version; /* the round's model version */
	int64_t index;    /* batches of a round count from 0 */
	uint64_t base;    /* the bucket's memory: views inside [base, base+base_len) */
	uint64_t base_len;
	int32_t device; /* -1: host memory; otherwise the CUDA ordinal of base */
	int32_t pad;
} wc_batch;

/* Open rank 0 (wc_open_sender) or a receiving rank (wc_open_receiver) of a
 * group, from a JSON object with any of: "group", "rank", "world_size",
 * "rendezvous" ("etcd://HOST:PORT"), "run_id", "transport" ("auto", "tcp",
 * "ipc", "nccl"), "bucket" (bytes, or a string such as "1GiB"), "timeout"
 * (seconds), "checksum" (bool), "device" ("cpu", "cuda", "cuda:N"),
 * "advertise", "secret_file" (the group secret's file, mode 0600; default
 * $WEIGHTCAST_SECRET_FILE), "tls_ca", "tls_cert", "tls_key" (mutual TLS),
 * "serve_rendezvous", "dtype", "quantize", "quantize_include",
 * "quantize_exclude", "direct" (bool), "turns" (bool), "bucket_mac" ("blake3",
 * "poly1305-aes"), and "env": the JSON form of the Go
 * library's weightcast.Options (its defaults fill what is left out; docs/
 * operations.md section 1 lists them). Missing or null rank, world_size, rendezvous, run_id
 * and device come from the torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR
 * and MASTER_PORT with rank 0 serving the rendezvous, TORCHELASTIC_RUN_ID,
 * LOCAL_RANK), read from "env" (an object of strings) when it is given, else
 * from the process environment. Returns once every rank has joined; *handle
 * is then set. */
int wc_open_sender(char *config_json, int64_t *handle);
int wc_open_receiver(char *config_json, int64_t *handle);

/* Start sending one round: n tensors as model version (above the last
 * committed one). Returns at once; wc_wait reports the end. */
int wc_send(int64_t handle, uint64_t version, wc_tensor *tensors, int64_t n, char *names, int64_t names_len, int64_t *dims, int64_t ndims);

/* Wait at most timeout_ms for the round wc_send or wc_receive_into started:
 * WC_AGAIN while it runs, WC_OK once every receiver committed it, or the
 * round's error. A round wc_receive started is taken with wc_next instead
 * (WC_ERR_CONFIG here), and wc_next refuses a wc_receive_into round. */
int wc_wait(int64_t handle, int32_t timeout_ms);

/* Start receiving one round straight into n tensors of the caller's, by
 * name (descriptors as wc_send's; wc_tensor.stream: the CUstream whose
 * queued work uses the tensor, waited for before the first write), as a
 * rollout engine updates its parameters in place: device tensors on the
 * receiver's GPU when its buckets are on a GPU, host tensors when they are
 * in host memory. Returns at once; wc_wait reports the end, after which
 * every byte is in place. A received tensor not among them, or one of
 * another dtype or shape, fails the round on every rank naming it; the
 * tensors must stay allocated until wc_wait reports the end. */
int wc_receive_into(int64_t handle, wc_tensor *tensors, int64_t n, char *names, int64_t names_len, int64_t *dims, int64_t ndims);

/* Start receiving one round; take it bucket by bucket with wc_next. */
int wc_receive(int64_t handle);

/* Release the batch the previous wc_next returned (the bucket is reused once
 * an event recorded now on stream — a CUstream of the receiver's GPU, 0 for
 * the legacy default stream; ignored for host buckets — has completed), then
 * wait at most timeout_ms for the next: WC_OK with *out filled, WC_DONE when
 * the round is committed, WC_AGAIN, or the round's error. */
int wc_next(int64_t handle, uint64_t stream, int32_t timeout_ms, wc_batch *out);

/* One tensor of a wc_views, 64 bytes of 8-byte fields, so that a caller can
 * read a batch's views as one array of int64 (Python: one memoryview). */
typedef struct wc_view {
	int64_t region;  /* index into the regions of the memory its bytes lie in (-1: no bytes, host memory) */
	uint64_t offset; /* of its first byte from the region's base */
	uint64_t nbytes;
	char dtype[8];   /* safetensors spelling, NUL-padded: "BF16", "F8_E4M3", ... */
	int64_t ndim;
	int64_t dims;     /* index into the dims array of the first of ndim dimensions */
	int64_t name;     /* offset into the names array (UTF-8, not NUL-terminated) */
	int64_t name_len; /* its length in bytes */
} wc_view;

/* One range of memory that views of a wc_views lie in: the bucket, a buffer
 * a tensor split across buckets was assembled in, or (receivers on the
 * sender's GPU) an allocation of the sender's, mapped here, read in place.
 * A caller may view a region once and slice its tensors out of it; the
 * regions of the buckets recur from batch to batch and round to round. */
typedef struct wc_region {
	uint64_t base;  /* address: host memory, or device memory when device >= 0 */
	uint64_t len;   /* bytes */
	int64_t device; /* -1: host memory; otherwise the CUDA device ordinal */
	int64_t pad;
} wc_region;

/* One received bucket's whole tensors, filled by wc_next_views. */
typedef struct wc_views {
	wc_view *views;
	int64_t n;
	wc_region *regions;
	int64_t nregions;
	char *names;
	int64_t names_len;
	int64_t *dims;
	int64_t ndims;
	uint64_t version; /* the round's model version */
	int64_t index;    /* batches of a round count from 0 */
} wc_views;

/* wc_next, describing the batch as views of regions (above) rather than
 * as wc_tensor records: the same release, wait, codes and lifetimes (a
 * wc_views and what it points to are valid until the next wc_next or
 * wc_next_views, wc_abort or wc_close on the handle). */
int wc_next_views(int64_t handle, uint64_t stream, int32_t timeout_ms, wc_views *out);

/* End every wc_open_sender and wc_open_receiver in flight in this process
 * (from another thread: a signal handler's, say), with reason as the cause
 * the other ranks report; each returns WC_ERR_ABORTED. Returns how many. */
int wc_interrupt(char *reason);

/* Fail the running round (or, between rounds, the next) on every rank, with
 * reason as the cause the others report. The handle is broken after it. */
int wc_abort(int64_t handle, char *reason);

/* The last version committed on every receiver (0: none yet). */
int wc_committed(int64_t handle, uint64_t *version);

/* What a receiver's last round left: 0 intact, 1 partial (resync needed). */
int wc_state(int64_t handle, int32_t *state);

/* Routed groups ("senders" above 0 in the config): ranks below senders send
 * their shards, the others receive only what they need ("tp", "tp_rank").
 *
 * Start sending one round of a routed group: n shards, described by layout,
 * a JSON array of {"name", "dtype", "shape" (global), "offset", "size"} (the
 * slice held), whose bytes lie in host memory at data[i] (row-major,
 * contiguous; they stay the caller's and must stay unchanged until wc_wait
 * reports the round's end). Every sender gives the same version. */
int wc_send_shards(int64_t handle, uint64_t version, char *layout, uint64_t *data, int64_t n);

/* Start receiving one round of a routed group into the handle's own memory
 * (the last committed version stays whole while a round runs); wc_wait
 * reports the end. */
int wc_receive_shards(int64_t handle);

/* The shards the last committed routed round left, as a JSON array of
 * {"name", "dtype", "shape", "offset", "size", "data" (address of the bytes:
 * C memory, or device memory of the rank's GPU, valid until the commit of
 * the round after next), "nbytes", "device" (-1: host; else the ordinal)},
 * copied into buf (NUL-terminated, truncated to cap). Returns the full
 * length, or an error code. */
int64_t wc_shards(int64_t handle, char *buf, int64_t cap);

/* A JSON object describing the handle ("role", "rank", "world_size",
 * "transport", "reason", "device", "cuda", and, once a round has ended and no
 * other runs, "last_round": {"version", "bytes", "buckets", "tensors",
 * "seconds"} of that round on this rank), copied into buf (NUL-terminated,
 * truncated to cap). Returns the full length, or an error code. */
int64_t wc_info(int64_t handle, char *buf, int64_t cap);

/* Close the handle: ends a running round, releases everything. Idempotent:
 * closing a closed handle returns WC_OK. */
int wc_close(int64_t handle);

/* The text of the calling thread's last error, copied into buf
 * (NUL-terminated, truncated to cap); returns its full length (0: none). */
int64_t wc_last_error(char *buf, int64_t cap);

/* When the calling thread's last error is about one configuration field,
 * a JSON object {"field", "value", "problem", "prefix"}: the last error's
 * text is prefix + field + " " + value + problem (value may be empty, and
 * then without its space), so that a caller can name the field its own way
 * (Python: "bucket=100 is below ..."). Copied as wc_last_error copies; the
 * full length is returned, 0 when the last error names no field. */
int64_t wc_last_error_field(char *buf, int64_t cap);

#endif
