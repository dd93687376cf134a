"""ctypes bindings of libweightcast.so (see capi/weightcast.h)."""

import ctypes
import json
import os
import struct
import threading

from .errors import from_code

OK, AGAIN, DONE = 0, 1, 2
ERR_CLOSED = -6
STRIDED = 1

# struct wc_tensor: data, nbytes, stream, dims, ndim, device, name,
# name_len, flags, dtype[12] — 64 bytes.
TENSOR = struct.Struct("<QQQqiiiii12s")
assert TENSOR.size == 64


class Batch(ctypes.Structure):
    _fields_ = [
        ("tensors", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("names", ctypes.c_void_p),
        ("names_len", ctypes.c_int64),
        ("dims", ctypes.c_void_p),
        ("ndims", ctypes.c_int64),
        ("version", ctypes.c_uint64),
        ("index", ctypes.c_int64),
        ("base", ctypes.c_uint64),
        ("base_len", ctypes.c_uint64),
        ("device", ctypes.c_int32),
        ("pad", ctypes.c_int32),
    ]


# struct wc_view: region, offset, nbytes, dtype[8], ndim, dims, name,
# name_len — eight 8-byte fields, read as int64 columns (the dtype as the
# integer of its 8 NUL-padded bytes, little-endian); struct wc_region:
# base, len, device, pad.
VIEW_WORDS, REGION_WORDS = 8, 4


class Views(ctypes.Structure):
    _fields_ = [
        ("views", ctypes.c_void_p),
        ("n", ctypes.c_int64),
        ("regions", ctypes.c_void_p),
        ("nregions", ctypes.c_int64),
        ("names", ctypes.c_void_p),
        ("names_len", ctypes.c_int64),
        ("dims", ctypes.c_void_p),
        ("ndims", ctypes.c_int64),
        ("version", ctypes.c_uint64),
        ("index", ctypes.c_int64),
    ]


def dtype_code(wire):
    """The integer a wc_view's dtype field reads as for a wire dtype."""
    return int.from_bytes(wire.encode().ljust(8, b"\0"), "little", signed=True)


_lib = None
_lock = threading.Lock()


def path():
    """Where the library is loaded from: $WEIGHTCAST_LIBRARY, or next to
    this package (``make python`` puts it there)."""
    return os.environ.get("WEIGHTCAST_LIBRARY") or os.path.join(os.path.dirname(__file__), "libweightcast.so")


def lib():
    """The loaded library (loaded, and the Go runtime started, on first use)."""
    global _lib
    with _lock:
        if _lib is None:
            p = path()
            if not os.path.exists(p):
                raise OSError(f"weightcast: {p} not found; build it with `make python` (or set WEIGHTCAST_LIBRARY)")
            L = ctypes.CDLL(p)
            i64, u64, i32, vp, cp = ctypes.c_int64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_char_p
            sig = {
                "wc_open_sender": ([cp, ctypes.POINTER(i64)], ctypes.c_int),
                "wc_open_receiver": ([cp, ctypes.POINTER(i64)], ctypes.c_int),
                "wc_send": ([i64, u64, vp, i64, vp, i64, vp, i64], ctypes.c_int),
                "wc_wait": ([i64, i32], ctypes.c_int),
                "wc_receive": ([i64], ctypes.c_int),
                "wc_receive_into": ([i64, vp, i64, vp, i64, vp, i64], ctypes.c_int),
                "wc_next": ([i64, u64, i32, ctypes.POINTER(Batch)], ctypes.c_int),
                "wc_next_views": ([i64, u64, i32, ctypes.POINTER(Views)], ctypes.c_int),
                "wc_abort": ([i64, cp], ctypes.c_int),
                "wc_interrupt": ([cp], ctypes.c_int),
                "wc_committed": ([i64, ctypes.POINTER(u64)], ctypes.c_int),
                "wc_state": ([i64, ctypes.POINTER(i32)], ctypes.c_int),
                "wc_info": ([i64, cp, i64], i64),
                "wc_close": ([i64], ctypes.c_int),
                "wc_send_shards": ([i64, u64, cp, ctypes.POINTER(u64), i64], ctypes.c_int),
                "wc_receive_shards": ([i64], ctypes.c_int),
                "wc_shards": ([i64, cp, i64], i64),
                "wc_last_error": ([cp, i64], i64),
                "wc_last_error_field": ([cp, i64], i64),
            }
            for name, (args, res) in sig.items():
                f = getattr(L, name)
                f.argtypes, f.restype = args, res
            _lib = L
        return _lib


def _copy(fn):
    n = fn(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    fn(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def last_error():
    return _copy(lib().wc_last_error)


def last_error_field():
    """The field detail of this thread's last error (a dict of field, value,
    problem and prefix), or None when it names no configuration field."""
    text = _copy(lib().wc_last_error_field)
    return json.loads(text) if text else None


def check(rc):
    """Raise the exception of a negative status; return the others."""
    if rc < 0:
        raise from_code(rc, last_error(), last_error_field())
    return rc
