"""Sender and Receiver: the weightcast library (libweightcast.so) from Python."""

import collections
import ctypes
import gc
import json
import os
import sys
import threading
from array import array

from . import _lib
from .errors import ConfigError, Error

# Element types: safetensors spelling by numpy dtype name, and by torch dtype.
_NUMPY = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
    "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64",
    "float16": "F16", "float32": "F32", "float64": "F64",
}
# Wire dtypes numpy has no type for are handed out raw (same width).
_NUMPY_OF = {v: k for k, v in _NUMPY.items()}
_NUMPY_OF.update({"BF16": "uint16", "F8_E4M3": "uint8", "F8_E5M2": "uint8"})
_TORCH_NAMES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16",
    "int32": "I32", "uint32": "U32", "int64": "I64", "uint64": "U64",
    "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}

_TORCHRUN = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "WEIGHTCAST_SECRET_FILE")
_POLL_MS = 100  # how long one wait in the library lasts before Python checks for signals


def _torch():
    return sys.modules.get("torch")


def _numpy():
    return sys.modules.get("numpy")


# Element widths by wire dtype.
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8,
             "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
_TABLES = {}  # by id of the torch module: the tables below, made once


def _tables(torch):
    """The dtype tables of a torch module, made at its first use: wire by
    torch dtype; (wire as bytes, itemsize) by torch dtype for _describe;
    and (torch dtype, itemsize) by the integer code of a wc_view's dtype
    for _views (the dtype None where this torch lacks it: U16, U32, U64
    before torch 2.3; FP8 without float8 dtypes comes as raw uint8)."""
    t = _TABLES.get(id(torch))
    if t is not None and t[0] is torch:
        return t[1]
    wires, describe, views = {}, {}, {}
    for name, wire in _TORCH_NAMES.items():
        dt = getattr(torch, name, None)
        if dt is not None:
            wires[dt] = wire
            describe[dt] = (wire.encode(), _ITEMSIZE[wire])
    by_wire = {w: dt for dt, w in wires.items()}
    for wire, size in _ITEMSIZE.items():
        dt = by_wire.get(wire)
        if dt is None and wire.startswith("F8_"):
            dt = torch.uint8
        views[_lib.dtype_code(wire)] = (dt, size)
    tables = (wires, describe, views)
    _TABLES[id(torch)] = (torch, tables)
    return tables


def _torch_dtypes(torch):
    """Wire dtype by torch dtype."""
    return _tables(torch)[0]


def _open(fn, cfg, who):
    """Call an open of the library (which waits for every rank to join) on
    a thread of its own, so that Ctrl-C reaches Python meanwhile: it ends
    the open, and the other ranks are told why, instead of waiting out
    their timeout. Returns the handle."""
    out = {}

    def run():
        h = ctypes.c_int64()
        try:
            _lib.check(fn(cfg, ctypes.byref(h)))  # the error text is this thread's
            out["h"] = h.value
        except BaseException as e:
            out["err"] = e

    t = threading.Thread(target=run, name="weightcast-open", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.1)
    except KeyboardInterrupt:
        L = _lib.lib()
        L.wc_interrupt(f"{who}: interrupted (Ctrl-C) while opening".encode())
        t.join()  # the open ends at once with its context
        if "h" in out:  # it had finished: leave the group again
            L.wc_abort(out["h"], f"{who}: interrupted (Ctrl-C)".encode())
            L.wc_close(out["h"])
        raise
    if "err" in out:
        raise out["err"]
    return out["h"]


class Shard(collections.namedtuple("Shard", "name tensor shape offsets")):
    """One slice a receiver of a routed group holds: the tensor's name, its
    local tensor, the global shape and the offsets of the slice in it."""


class _Rank:
    """What Sender and Receiver share: the handle, its options, close."""

    _open = None  # the library's open call, by name

    def __init__(self, rank, world_size, rendezvous, run_id, group, transport, bucket, timeout, checksum, device, security, extra=None):
        # Keywords left None are left out: the library fills its defaults
        # (weightcast.Options.Validate), so they are written once, in Go.
        cfg = {k: v for k, v in (("group", group), ("transport", transport), ("bucket", bucket)) if v is not None}
        if timeout is not None:
            cfg["timeout"] = float(timeout)
        if checksum is not None:
            cfg["checksum"] = bool(checksum)
        cfg.update({k: str(v) for k, v in security.items() if v is not None})
        cfg.update({k: v for k, v in (extra or {}).items() if v is not None})
        for key, value in (("rank", rank), ("world_size", world_size), ("rendezvous", rendezvous), ("run_id", run_id)):
            if value is not None:
                cfg[key] = value
        if device is not None:
            cfg["device"] = f"cuda:{device}" if isinstance(device, int) else str(device)
        # The Go runtime keeps its own copy of the environment from when the
        # library loaded: hand over Python's view of the torchrun variables.
        cfg["env"] = {k: os.environ[k] for k in _TORCHRUN if k in os.environ}
        self._h = None
        who = cfg.get("rank", cfg["env"].get("RANK", "?"))
        self._h = _open(getattr(_lib.lib(), self._open), json.dumps(cfg).encode(), f"rank {who}")
        info = self._info()
        self.rank, self.world_size = info["rank"], info["world_size"]
        self.transport, self.device = info["transport"], info["device"]
        self._cuda = info.get("cuda", -1)

    def _info(self):
        buf = ctypes.create_string_buffer(8192)
        _lib.check(_lib.lib().wc_info(self._handle(), buf, len(buf)))
        return json.loads(buf.value)

    @property
    def last_round(self):
        """What the last round moved on this rank, once it ended: a dict of
        ``version``, ``bytes`` (bucket bytes, after any rollout dtype cast),
        ``buckets``, ``tensors`` and ``seconds``; None before the first
        (and on a trainer rank that does not send)."""
        if getattr(self, "_idle", False):
            return None
        return self._info().get("last_round")

    def _handle(self):
        if self._h is None:
            raise ConfigError(f"this {type(self).__name__} is closed", _lib.ERR_CLOSED)
        return self._h

    def _abort(self, reason):
        if self._h is not None:
            _lib.lib().wc_abort(self._h, reason.encode("utf-8", "replace"))

    def _wait(self, step):
        """Call step(ms) until it returns something other than AGAIN; on
        Ctrl-C abort the round on every rank, let it end, and re-raise."""
        try:
            while True:
                rc = step(_POLL_MS)
                if rc != _lib.AGAIN:
                    return _lib.check(rc)
        except KeyboardInterrupt:
            self._abort(f"rank {self.rank}: interrupted (Ctrl-C)")
            self._drain(step)
            raise

    def _drain(self, step):
        """Let an aborted round end (bounded by the library's own waits)."""
        try:
            while step(_POLL_MS) in (_lib.AGAIN, _lib.OK):
                pass
        except KeyboardInterrupt:
            pass

    @property
    def version(self):
        """The last model version committed on every receiver (0: none)."""
        v = ctypes.c_uint64()
        _lib.check(_lib.lib().wc_committed(self._handle(), ctypes.byref(v)))
        return v.value

    def close(self):
        """End a running round and release everything. Idempotent."""
        h, self._h = self._h, None
        if h is not None:
            _lib.check(_lib.lib().wc_close(h))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None:
            # Tell the other ranks why, before leaving: the round this
            # rank was part of fails everywhere with this cause.
            why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else f"{exc_type.__name__}: {exc}"
            self._abort(f"rank {self.rank}: {why}")
            try:
                self.close()
            except Error:
                pass  # the exception in flight says what went wrong
            return
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Sender(_Rank):
    """Rank 0 of a group: sends model weights to every receiver.

    Keywords left None come from the torchrun variables (RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT — rank 0 then serves the rendezvous there —
    TORCHELASTIC_RUN_ID, LOCAL_RANK); ``rendezvous="etcd://HOST:PORT"``
    meets at an etcd instead. ``group`` names the group ("weightcast");
    ``transport`` is "auto" or one of "tcp", "ipc", "nccl". ``bucket`` is
    each of the two bucket buffers' size (bytes, or a string such as
    "256MiB"; 1 GiB); ``timeout`` (seconds; 120) bounds every wait;
    ``checksum=False`` turns the per-bucket checksum off. Left None, the
    library's defaults (in parentheses) apply; ``device`` ("cpu", "cuda:N", an int or a torch.device) says
    where the buckets live when the transport puts them on a GPU.
    ``secret_file`` (default $WEIGHTCAST_SECRET_FILE) names the group secret
    every rank must prove it holds; ``tls_ca``, ``tls_cert`` and ``tls_key``
    the PEM files of mutual TLS for etcd, the tcp chain and the bus.
    ``dtype`` (a torch dtype, or "bf16", "f16", "f32") is the rollout dtype:
    floating-point tensors are cast to it by the library before they are
    sent, on the GPU for CUDA tensors. ``serve_rendezvous=True`` with
    ``rendezvous="etcd://HOST:PORT"`` has rank 0 serve the rendezvous there
    itself (what MASTER_ADDR/MASTER_PORT do under torchrun), for launchers
    that number ranks themselves; ``advertise`` is the address other hosts
    reach this one at.
    ``quantize="fp8-block"`` sends the 2-D linear weights as F8_E4M3 codes
    with F32 ``<name>_scale_inv`` per 128x128 block (docs/operations.md).
    ``bucket_mac`` ("blake3", the default, or "poly1305-aes") is the MAC
    every bucket carries with a group secret; receivers verify either.

    Trainer ranks that do not send (verl's rank -1) make ``Sender(rank=-1)``:
    it joins nothing, and its send() only iterates the tensors, so that the
    collectives inside a generator such as FSDP's full_tensor() still run on
    every trainer rank.
    """

    _open = "wc_open_sender"

    def __init__(self, *, rank=None, world_size=None, rendezvous=None, run_id=None, group=None,
                 transport=None, bucket=None, timeout=None, checksum=None, device=None,
                 secret_file=None, tls_ca=None, tls_cert=None, tls_key=None,
                 dtype=None, serve_rendezvous=False, advertise=None, quantize=None, senders=None,
                 bucket_mac=None):
        self._routed = bool(senders)
        if rank == -1:
            self._h, self.rank, self.world_size, self.transport, self.device = None, -1, world_size, None, None
            self._idle = True
            return
        self._idle = False
        super().__init__(rank, world_size, rendezvous, run_id, group, transport, bucket, timeout, checksum, device,
                         dict(secret_file=secret_file, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key),
                         dict(dtype=_dtype_name(dtype), serve_rendezvous=bool(serve_rendezvous) or None, advertise=advertise,
                              quantize=quantize, senders=senders, bucket_mac=bucket_mac))

    def send(self, named_tensors, version):
        """Send one round: every (name, tensor) of named_tensors (an iterable:
        model.named_parameters(), state_dict().items(), a generator) as model
        ``version``, which must be above the last committed one. Returns once
        every receiver has committed it, with ``last_round`` (a dict of
        version, bytes, buckets, tensors, seconds). A version that is not
        above the last committed one raises ConfigError.

        torch CUDA tensors are read in place from device memory, after the
        work already queued on the current stream of their device (no copy
        to the host, no device-wide synchronize); torch CPU tensors and numpy
        arrays are read from host memory. Every tensor is kept referenced
        until the round ends, so a generator's tensors all live at once. A
        non-contiguous tensor, an unsupported dtype or a name seen twice
        fails the round on every rank with an error naming the tensor.
        """
        if self._idle:
            for _ in named_tensors:
                pass
            return None
        if self._routed:
            from . import _routed
            torch = _torch()
            return _routed.send(self, named_tensors, version, torch, _numpy(), _torch_dtypes(torch) if torch is not None else {})
        h = self._handle()
        try:
            recs, names, dims, keep = _describe(named_tensors)
        except BaseException as e:
            self._abort(f"rank 0: building version {version} failed: {type(e).__name__}: {e}")
            raise
        L = _lib.lib()
        _lib.check(L.wc_send(h, version, *_flat(recs, names, dims)))
        self._wait(lambda ms: L.wc_wait(h, ms))
        del keep
        return self.last_round

    def close(self):
        if not getattr(self, "_idle", False):
            super().close()


def _flat(recs, names, dims):
    """The arguments after the handle of wc_send and wc_receive_into for
    the descriptors _describe built: records, count, names, their length,
    dims, their count (addresses into the buffers, which the caller keeps
    alive during the call; the library reads them only then)."""
    n = len(recs) // _lib.TENSOR.size
    rptr = ctypes.addressof((ctypes.c_char * len(recs)).from_buffer(recs)) if recs else None
    nptr = ctypes.addressof((ctypes.c_char * len(names)).from_buffer(names)) if names else None
    dptr = dims.buffer_info()[0] if dims else None
    return rptr, n, nptr, len(names), dptr, len(dims)


def _what(x):
    """A short description of a value for an error message."""
    if isinstance(x, tuple):
        return f"a tuple of {len(x)}"
    return f"a {type(x).__module__}.{type(x).__name__}" if type(x).__module__ not in ("builtins",) else f"a {type(x).__name__}"


def _dtype_name(dtype):
    """The library's spelling of a rollout dtype: a torch dtype or a name."""
    if dtype is None:
        return None
    name = str(dtype).replace("torch.", "").lower()
    return {"bfloat16": "bf16", "float16": "f16", "half": "f16", "float32": "f32", "float": "f32"}.get(name, name)


def _need_numpy(device):
    """A receiver whose buckets may be in host memory hands them out through
    numpy: refuse to join without it, before any other rank waits on us."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        torch = _torch()
        on_gpu = device not in ("cpu", "host") and torch is not None and torch.cuda.is_available()
        if not on_gpu:
            raise ConfigError("weightcast.Receiver needs numpy for buckets in host memory (pip install numpy); "
                              "only a receiver whose buckets are on a GPU can do without it") from None


def _describe(named_tensors):
    """The flat descriptors of a round (see wc_tensor in weightcast.h): the
    records, the names, the dims, and the tensors, kept referenced until the
    round ends. The Python side's whole cost per tensor is here."""
    recs, names, dims, keep = bytearray(), bytearray(), array("q"), []
    streams = {}
    torch = _torch()
    np = _numpy()
    Tensor = torch.Tensor if torch is not None else ()
    tdt = _tables(torch)[1] if torch is not None else {}
    npdt = _numpy_wires(np) if np is not None else {}
    ndarray = np.ndarray if np is not None else ()
    pack, keep_one, add_dims = _lib.TENSOR.pack, keep.append, dims.extend
    strided = _lib.STRIDED
    d0 = n0 = 0  # where the next tensor's dims and name go
    if hasattr(named_tensors, "items") and callable(named_tensors.items):
        named_tensors = named_tensors.items()  # a state_dict or any mapping
    for item in named_tensors:
        try:
            name, t = item
        except (TypeError, ValueError):
            raise ConfigError(f"send: each item must be a (name, tensor) pair, got {_what(item)}; pass model.named_parameters(), "
                              "state_dict().items() or a dict of name -> tensor") from None
        if not isinstance(name, str):
            raise ConfigError(f"send: a tensor's name must be a str, got {_what(name)}; pass (name, tensor) pairs")
        keep_one(t)
        nb = name.encode()
        if isinstance(t, Tensor):
            w = tdt.get(t.dtype)
            if w is None:  # refused by the library, naming the tensor
                w = (str(t.dtype).replace("torch.", "").encode(), t.element_size())
            if t.is_cuda:
                dev = t.get_device()
                stream = streams.get(dev)
                if stream is None:
                    stream = streams[dev] = torch.cuda.current_stream(dev).cuda_stream
            else:
                dev, stream = -1, 0
            shape = t.shape
            nd, nl = len(shape), len(nb)
            # Tensor.nbytes is missing on torch 1.13's Parameters.
            recs += pack(t.data_ptr(), w[1] * t.numel(), stream, d0, nd, dev, n0, nl,
                         0 if t.is_contiguous() else strided, w[0])
        elif isinstance(t, ndarray):
            wire = npdt.get(t.dtype) or t.dtype.name.encode()
            shape = t.shape
            nd, nl = len(shape), len(nb)
            recs += pack(t.ctypes.data if t.nbytes else 0, t.nbytes, 0, d0, nd, -1, n0, nl,
                         0 if t.flags.c_contiguous else strided, wire)
        else:
            raise ConfigError(f"tensor {name!r} is a {type(t).__name__}; send torch tensors or numpy arrays")
        names += nb
        add_dims(shape)
        d0 += nd
        n0 += nl
    return recs, names, dims, keep


_NUMPY_WIRES = {}


def _numpy_wires(np):
    """Wire dtype (bytes) by numpy dtype object, made once: numpy's
    dtype.name is slow (microseconds)."""
    t = _NUMPY_WIRES.get(id(np))
    if t is None or t[0] is not np:
        t = _NUMPY_WIRES[id(np)] = (np, {np.dtype(k): v.encode() for k, v in _NUMPY.items()})
    return t[1]


class Receiver(_Rank):
    """A receiving rank (1 .. world_size-1) of a group. Same keywords as
    Sender, less ``dtype``, ``quantize`` and ``serve_rendezvous``."""

    _open = "wc_open_receiver"

    def __init__(self, *, rank=None, world_size=None, rendezvous=None, run_id=None, group=None,
                 transport=None, bucket=None, timeout=None, checksum=None, device=None,
                 secret_file=None, tls_ca=None, tls_cert=None, tls_key=None, advertise=None,
                 senders=None, tp=None, heads=None, kv_heads=None, tp_rules=None):
        _need_numpy(device)
        self._batch = _lib.Views()
        self._regions = {}  # views of the memory batches lie in (_views), kept across batches and rounds
        self._routed = bool(senders)
        routed = {}
        if tp is not None:
            if not senders:
                raise ConfigError("tp= takes a routed group: give senders= (the number of sending ranks) on every rank")
            size, r = (tp, None) if isinstance(tp, int) else (tp[1], tp[0])
            if r is None:
                me = rank if rank is not None else int(os.environ.get("RANK", "-1"))
                r = (me - senders) % size if me >= 0 else 0
            routed = dict(tp=int(size), tp_rank=int(r), heads=heads, kv_heads=kv_heads, tp_rules=list(tp_rules) if tp_rules else None)
        super().__init__(rank, world_size, rendezvous, run_id, group, transport, bucket, timeout, checksum, device,
                         dict(secret_file=secret_file, tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key),
                         dict(advertise=advertise, senders=senders, **routed))

    @property
    def state(self):
        """What the last round left: "intact", or "partial" after a round that
        failed while the caller was loading it in place (resync)."""
        s = ctypes.c_int32()
        _lib.check(_lib.lib().wc_state(self._handle(), ctypes.byref(s)))
        return "partial" if s.value else "intact"

    def _stream(self, torch):
        if self._cuda >= 0 and torch is not None:
            return torch.cuda.current_stream(self._cuda).cuda_stream
        return 0

    def receive(self):
        """Receive one round: a generator of (name, tensor), views into the
        received bucket — torch CUDA tensors when the buckets are on a GPU;
        on a host numpy arrays, or torch CPU tensors when torch is imported
        (BF16 and FP8 come as raw uint16 / uint8 numpy arrays, or as their
        torch dtypes). On the sender's GPU (ipc) the views are of the
        sender's tensors themselves, read in place, each bucket's checksum
        checked there before its first view is handed out. A view is valid
        until the generator moves past its bucket; the bucket (or the
        sender's tensors) is reused only after the work queued on the
        current stream until then has finished. Leaving the generator
        before its end aborts the round on every rank. After the round,
        ``version`` is the committed version.
        """
        torch = _torch()
        if self._routed:
            for sh in self.receive_shards():
                yield sh.name, sh.tensor
            return
        rnd = _Round(self)
        try:
            while True:
                views = rnd.next(self._stream(torch))
                if views is None:
                    return
                yield from zip(*views)
        finally:
            rnd.close()

    def receive_shards(self):
        """Receive one round of a routed group (``senders=``): a list of
        Shard(name, tensor, shape, offsets), this receiver's slice of each
        tensor it needs (its ``tp`` shard: ``shape`` is the global shape,
        ``offsets`` where the slice starts in it), once the round is
        committed on every receiver. The tensors are views of the library's
        memory, valid until the round after next commits; the last
        committed version stays whole while a round runs."""
        if not self._routed:
            raise ConfigError("receive_shards is for routed groups (senders=); this group broadcasts whole tensors: use receive()")
        from . import _routed
        return [Shard(*s) for s in _routed.receive(self, _torch())]

    async def areceive(self):
        """receive() for asyncio: an async generator of the same (name,
        tensor) views, waiting for each bucket in a worker thread so the
        event loop runs on. The bucket is reused only after the work queued
        until then on the current stream of the thread iterating it."""
        import asyncio
        loop = asyncio.get_running_loop()
        torch = _torch()
        rnd = _Round(self)
        try:
            while True:
                views = await loop.run_in_executor(None, rnd.next, self._stream(torch))
                if views is None:
                    return
                for item in zip(*views):
                    yield item
        finally:
            await loop.run_in_executor(None, rnd.close)

    def load_into(self, mapping):
        """Receive one round copied in place into the tensors or arrays of
        mapping (name -> tensor: dict(model.named_parameters()), a dict of
        numpy arrays). A received name the mapping lacks, or a shape or dtype
        that differs, is an error naming the tensor, and the round fails on
        every rank.

        When the buckets are on a GPU and every value is a contiguous torch
        tensor on that GPU, the library writes the round into them itself,
        in the copies that check each bucket's checksum (and, on the
        sender's GPU, straight from the sender's tensors), after the work
        queued on the current stream; otherwise each received view is
        copied in Python (tensor.copy_, numpy.copyto)."""
        torch = _torch()
        if self._routed:
            # The round is committed before its shards are copied: a
            # mapping that lacks one fails here, on this rank only.
            tdt = _torch_dtypes(torch) if torch is not None else {}
            for name, view, _, _ in self.receive_shards():
                dst = mapping.get(name)
                if dst is None:
                    raise ConfigError(f"load_into: received shard {name!r}, which the mapping does not have")
                _copy(name, dst, view, torch, tdt)
            return
        if self._cuda >= 0 and torch is not None and _on_gpu(mapping, torch, self._cuda):
            self._receive_into(mapping)
            return
        tdt = _torch_dtypes(torch) if torch is not None else {}
        gen = self.receive()
        try:
            for name, view in gen:
                dst = mapping.get(name)
                if dst is None:
                    raise ConfigError(f"load_into: received tensor {name!r}, which the mapping does not have")
                _copy(name, dst, view, torch, tdt)
        except BaseException as e:
            self._abort(f"rank {self.rank}: {type(e).__name__}: {e}")
            raise
        finally:
            gen.close()

    def _receive_into(self, mapping):
        """load_into through the library: one call with every destination."""
        h = self._handle()
        recs, names, dims, keep = _describe(mapping.items())
        L = _lib.lib()
        _lib.check(L.wc_receive_into(h, *_flat(recs, names, dims)))
        self._wait(lambda ms: L.wc_wait(h, ms))
        del keep


class _Round:
    """One receive() round of a Receiver: next(stream) waits for the next
    bucket and returns its views (a list of names and one of tensors, in
    order), or None once the round is
    committed on every receiver; the previous bucket is reused only after
    the work queued on stream until this call. close() after the end does
    nothing; before it, it aborts the round on every rank and lets it end."""

    def __init__(self, receiver):
        self._r = receiver
        self._h = receiver._handle()
        self._stream = 0
        self._finished = False
        _lib.check(_lib.lib().wc_receive(self._h))

    def next(self, stream):
        L, h, batch = _lib.lib(), self._h, self._r._batch
        self._stream = stream
        rc = self._r._wait(lambda ms: L.wc_next_views(h, stream, ms, ctypes.byref(batch)))
        if rc == _lib.DONE:
            self._finished = True
            return None
        # A bucket's views are tens of thousands of new objects at most
        # and no cycles: the cyclic collector, left on, would run over
        # them (and, as they pile up, over everything) hundreds of times
        # per bucket, which costs more than making them.
        on = gc.isenabled()
        gc.disable()
        try:
            return _views(batch, _torch(), self._r._regions)
        finally:
            if on:
                gc.enable()

    def close(self):
        if self._finished:
            return
        self._finished = True
        L, h, batch, stream = _lib.lib(), self._h, self._r._batch, self._stream
        self._r._abort(f"rank {self._r.rank}: receive() was left before the round ended (the loop over it broke, raised, or was interrupted with Ctrl-C)")
        self._r._drain(lambda ms: L.wc_next_views(h, stream, ms, ctypes.byref(batch)))


def _on_gpu(mapping, torch, ordinal):
    """Whether every value of mapping is a contiguous torch tensor on CUDA
    device ordinal, which the library can write into itself."""
    for t in mapping.values():
        if not (isinstance(t, torch.Tensor) and t.is_cuda and t.get_device() == ordinal and t.is_contiguous()):
            return False
    return bool(mapping)


def _copy(name, dst, view, torch, tdt):
    """Copy one received view into the mapping's tensor or array."""
    shape = tuple(view.shape)
    if torch is not None and isinstance(dst, torch.Tensor):
        # With torch imported, every view is a torch tensor.
        if tuple(dst.shape) != shape or dst.dtype != view.dtype:
            raise ConfigError(f"load_into: tensor {name!r} arrived as {view.dtype}{list(shape)}, but the mapping's is {dst.dtype}{list(dst.shape)}")
        with torch.no_grad():
            dst.copy_(view)
        return
    np = _numpy()
    if np is None or not isinstance(dst, np.ndarray):
        raise ConfigError(f"load_into: the mapping's {name!r} is a {type(dst).__name__}; give torch tensors or numpy arrays")
    if torch is not None and isinstance(view, torch.Tensor):
        v = view.cpu() if view.is_cuda else view
        wire = tdt.get(v.dtype)
        if wire == "BF16":
            v = v.view(torch.int16).numpy().view(np.uint16)
        elif wire in ("F8_E4M3", "F8_E5M2"):
            v = v.view(torch.uint8).numpy()
        else:
            v = v.numpy()
    else:
        v = view
    if dst.shape != shape or dst.dtype != v.dtype:
        raise ConfigError(f"load_into: tensor {name!r} arrived as {v.dtype}{list(shape)}, but the mapping's is {dst.dtype}{list(dst.shape)}")
    np.copyto(dst, v)


def _as_torch(arr, wire, torch):
    """A host view as a torch CPU tensor of the wire dtype. BF16 goes
    through int16 (torch 1.13 has no uint16 tensors); FP8 stays raw uint8
    on a torch without float8 dtypes."""
    if wire == "BF16":
        return torch.from_numpy(arr.view("int16")).view(torch.bfloat16)
    try:
        t = torch.from_numpy(arr)
    except TypeError:
        return arr  # U16, U32, U64 on a torch without those dtypes (before 2.3)
    if wire in ("F8_E4M3", "F8_E5M2"):
        dt = getattr(torch, "float8_e4m3fn" if wire == "F8_E4M3" else "float8_e5m2", None)
        if dt is not None:
            t = t.view(dt)
    return t


class _CudaBuffer:
    """A device range as __cuda_array_interface__, for torch.as_tensor."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False), "strides": None, "version": 2}


_MAX_REGIONS = 1024  # views of regions kept per Receiver; past it they are all dropped and made again


def _words(addr, n):
    """n int64s at addr, as a list."""
    return memoryview(ctypes.string_at(addr, n * 8)).cast("q").tolist() if n > 0 else []


def _views(batch, torch, regions):
    """The views of one batch that wc_next_views filled: its names and its
    tensors, two lists in the batch's order. Each region of memory the
    batch lies in (the bucket, a buffer a split tensor was assembled in, an
    allocation of the sender's read in place) is viewed once per dtype and
    kept in regions, by its range, for later batches and rounds; the
    tensors of one region and dtype are cut out of that view with one
    split_with_sizes, so that the cost per tensor is one tensor made by
    torch (and a view() to its shape when it is not 1-D). With torch
    imported, host buckets give torch CPU tensors too."""
    n = batch.n
    if n <= 0:
        return [], []
    flat = _words(batch.views, n * _lib.VIEW_WORDS)
    reg, off, nbytes, code, ndim, dim0, name0, namelen = (flat[k::_lib.VIEW_WORDS] for k in range(_lib.VIEW_WORDS))
    rflat = _words(batch.regions, batch.nregions * _lib.REGION_WORDS)
    dims = _words(batch.dims, batch.ndims)
    raw = ctypes.string_at(batch.names, batch.names_len) if batch.names_len > 0 else b""
    text = raw.decode()
    if len(text) == len(raw):  # ASCII: byte offsets are character offsets
        names = [text[a:a + k] for a, k in zip(name0, namelen)]
    else:
        names = [raw[a:a + k].decode() for a, k in zip(name0, namelen)]
    if torch is None:
        return _numpy_views(names, reg, off, nbytes, code, ndim, dim0, dims, rflat, regions)
    table = _tables(torch)[2]
    out = [None] * n
    if len(set(reg)) == 1 and len(set(code)) == 1:
        groups = {(reg[0], code[0]): range(n)}
    else:
        groups = {}
        for i, key in enumerate(zip(reg, code)):
            g = groups.get(key)
            if g is None:
                groups[key] = [i]
            else:
                g.append(i)
    for (r, c), idx in groups.items():
        dt, size = table[c]
        device = rflat[r * _lib.REGION_WORDS + 2] if r >= 0 else -1
        if device >= 0 and dt is None:
            raise Error(f"tensor {names[idx[0]]!r} is {_wire(c)}, which this torch ({torch.__version__}) has no dtype for; use torch 2.3 or later")
        if dt is None:  # a host view of a dtype this torch lacks: numpy
            for i in idx:
                out[i] = _numpy_view(reg[i], off[i], nbytes[i], _wire(c), dims[dim0[i]:dim0[i] + ndim[i]], rflat, regions)
            continue
        if r < 0:  # no bytes, in host memory
            for i in idx:
                out[i] = torch.empty(dims[dim0[i]:dim0[i] + ndim[i]], dtype=dt)
            continue
        whole = _region(regions, torch, rflat, r, dt, size)
        if type(idx) is range and _cut_whole(whole, size, off, nbytes, ndim, dim0, dims, out):
            continue
        # Cut the tensors out in one split_with_sizes: the sizes of the
        # tensors, in order, with the gaps between them (alignment) and the
        # rest of the region as parts of their own. A tensor out of order
        # or overlapping another (tied weights read in place), or of no
        # bytes, is made by itself.
        sizes, picks, alone, at = [], [], [], 0
        for i in idx:
            o, k = off[i], nbytes[i]
            if o < at or k == 0 or o % size or k % size:
                alone.append(i)
                continue
            if o > at:
                sizes.append((o - at) // size)
            picks.append((i, len(sizes)))
            sizes.append(k // size)
            at = o + k
        if picks:
            rest = whole.shape[0] - at // size
            if rest:
                sizes.append(rest)
            if (len(sizes) - len(picks)) * 10 <= len(picks) * 7:
                parts = whole.split_with_sizes(sizes)
                for i, j in picks:
                    t = parts[j]
                    if ndim[i] != 1:
                        t = t.view(dims[dim0[i]:dim0[i] + ndim[i]])
                    out[i] = t
            else:  # mostly gaps: slice each tensor instead
                alone.extend(i for i, _ in picks)
        for i in alone:
            shape = dims[dim0[i]:dim0[i] + ndim[i]]
            if nbytes[i] == 0:
                t = torch.empty(shape, dtype=dt, device=whole.device)
            elif off[i] % size == 0:
                t = whole[off[i] // size:(off[i] + nbytes[i]) // size].view(shape)
            else:  # not aligned to its element in the region: a view of its own
                base, _, device = _key(rflat, r)
                t = _raw(torch, base + off[i], nbytes[i], device).view(dt).view(shape)
            out[i] = t
    return names, out


def _cut_whole(whole, size, off, nbytes, ndim, dim0, dims, out):
    """The tensors of a batch whose every view lies in one region with one
    dtype (whole: the region's view) and back to back (a bucket whose
    tensors' sizes are multiples of 64 bytes: wire.Align), cut out with
    one split_with_sizes and no work per tensor in Python beyond a view()
    to the shape of those that are not 1-D, into out. False, doing
    nothing, when the views are not laid out so."""
    n = len(off)
    if off[1:] != [o + k for o, k in zip(off[:-1], nbytes[:-1])] or 0 in nbytes:
        return False
    if size > 1 and (off[0] % size or any(map(size.__rmod__, nbytes))):
        return False
    sizes = list(map(size.__rfloordiv__, nbytes)) if size > 1 else list(nbytes)
    lead = off[0] // size
    rest = whole.shape[0] - lead - sum(sizes)
    if lead:
        sizes.insert(0, lead)
    if rest:
        sizes.append(rest)
    parts = whole.split_with_sizes(sizes)
    first = 1 if lead else 0
    if ndim.count(1) == n:
        out[:] = parts[first:first + n]
    else:
        out[:] = [t if d == 1 else t.view(dims[a:a + d]) for t, d, a in zip(parts[first:first + n], ndim, dim0)]
    return True


def _wire(code):
    """The wire dtype of a wc_view's dtype code."""
    return code.to_bytes(8, "little", signed=True).rstrip(b"\0").decode()


def _key(rflat, r):
    w = r * _lib.REGION_WORDS
    return rflat[w], rflat[w + 1], rflat[w + 2]


def _region(regions, torch, rflat, r, dt, size):
    """Region r of a batch viewed as a 1-D torch tensor of dt (its whole
    elements), made once and kept in regions."""
    key = _key(rflat, r)
    views = regions.get(key)
    if views is None:
        if len(regions) >= _MAX_REGIONS:
            regions.clear()
        views = regions[key] = {None: _raw(torch, *key)}
    t = views.get(dt)
    if t is None:
        u8 = views[None]
        length = key[1]
        t = views[dt] = (u8[:length - length % size] if length % size else u8).view(dt)
    return t


def _raw(torch, base, length, device):
    """length bytes at base (host memory, or on CUDA device device >= 0) as
    a torch uint8 tensor that does not own them."""
    if device >= 0:
        return torch.as_tensor(_CudaBuffer(base, length), device=torch.device("cuda", device))
    return torch.frombuffer((ctypes.c_uint8 * length).from_address(base), dtype=torch.uint8)


def _numpy_region(regions, rflat, r):
    """Region r of a batch (host memory) as a numpy uint8 array, kept."""
    import numpy as np
    base, length, _ = key = _key(rflat, r)
    k = key + ("numpy",)
    a = regions.get(k)
    if a is None:
        if len(regions) >= _MAX_REGIONS:
            regions.clear()
        a = regions[k] = np.ctypeslib.as_array((ctypes.c_uint8 * length).from_address(base))
    return a


def _numpy_view(r, o, k, wire, shape, rflat, regions):
    """One host view as a numpy array (BF16 as raw uint16, FP8 as uint8)."""
    import numpy as np
    npdt = np.dtype(_NUMPY_OF[wire])
    if k == 0 or r < 0:
        return np.empty(shape, dtype=npdt)
    return _numpy_region(regions, rflat, r)[o:o + k].view(npdt).reshape(shape)


def _numpy_views(names, reg, off, nbytes, code, ndim, dim0, dims, rflat, regions):
    """_views without torch: numpy arrays of host buckets."""
    for r in set(reg):
        if r >= 0 and rflat[r * _lib.REGION_WORDS + 2] >= 0:
            raise Error("this receiver's buckets are on a GPU: import torch to take its tensors as torch CUDA tensors")
    wires = {c: _wire(c) for c in set(code)}
    return names, [_numpy_view(reg[i], off[i], nbytes[i], wires[code[i]], dims[dim0[i]:dim0[i] + ndim[i]], rflat, regions)
                   for i in range(len(names))]
