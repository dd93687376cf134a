"""Routed groups from Python: many senders, sharded receivers.

A Sender or Receiver made with ``senders=S`` belongs to a routed group:
ranks 0..S-1 send what they hold, the other ranks receive only what they
need (``tp=(rank, size)``: their tensor-parallel shard, sliced as vLLM's
loaders slice Llama, Qwen and DeepSeek-style names), on a plan every rank
makes once per layout. See weightcast.Sender.send and Receiver.receive.
"""

import ctypes
import json
from array import array

from . import _lib
from .errors import ConfigError


def _dtensor_shard(t):
    """(local tensor, global shape, offsets) of a torch DTensor, or None."""
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError:
        return None
    if not isinstance(t, DTensor):
        return None
    from torch.distributed.tensor import Replicate, Shard
    for p in t.placements:
        if type(p) not in (Shard, Replicate):
            raise ConfigError(f"a DTensor placed as {p} holds no rectangular slice of its tensor; hand DTensors placed by Shard "
                              "and Replicate, or (name, local, shape, offsets) items")
    _, offsets = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return t.to_local(), tuple(t.shape), tuple(offsets)


def _shards(items, torch, np, wire_of, cuda):
    """The layout (a list of dicts) and the tensors of a sender's shards,
    kept referenced by the caller until the round ends: CUDA tensors stay
    on their GPU when the rank's buckets are there (cuda, the ordinal, or
    -1), other tensors are read from host memory."""
    from ._core import _NUMPY, _what
    if hasattr(items, "items") and callable(items.items):
        items = items.items()
    layout, keep = [], []
    npdt = {np.dtype(k): v for k, v in _NUMPY.items()} if np is not None else {}
    for item in items:
        if not isinstance(item, tuple) or len(item) not in (2, 4) or not isinstance(item[0], str):
            raise ConfigError(f"send: each item of a routed group's round is (name, tensor), (name, DTensor) or "
                              f"(name, local_tensor, global_shape, offsets); got {_what(item)}")
        name, t = item[0], item[1]
        if len(item) == 4:
            shape, offsets = tuple(int(d) for d in item[2]), tuple(int(o) for o in item[3])
        else:
            d = _dtensor_shard(t) if torch is not None else None
            if d is not None:
                t, shape, offsets = d
            else:
                shape, offsets = tuple(t.shape), (0,) * len(t.shape)
        device = -1
        if torch is not None and isinstance(t, torch.Tensor):
            if cuda >= 0:
                if not t.is_cuda:
                    t = t.to(f"cuda:{cuda}")  # this rank's buckets are on its GPU (ipc, nccl)
                device = t.get_device()
            elif t.is_cuda:
                t = t.detach().cpu()  # this rank's buckets are in host memory (tcp)
            t = t.detach().contiguous()
            wire = wire_of.get(t.dtype) or str(t.dtype).replace("torch.", "")
            addr, size = t.data_ptr(), tuple(t.shape)
        elif np is not None and isinstance(t, np.ndarray):
            t = np.ascontiguousarray(t)
            wire = npdt.get(t.dtype) or t.dtype.name
            addr, size = (t.ctypes.data if t.nbytes else 0), tuple(t.shape)
        else:
            raise ConfigError(f"shard {name!r} is a {type(t).__name__}; send torch tensors or numpy arrays")
        if len(offsets) != len(shape) or len(size) != len(shape):
            raise ConfigError(f"shard {name!r}: a local tensor of shape {list(size)} with offsets {list(offsets)} "
                              f"in a global shape {list(shape)}: give one offset per dimension")
        keep.append(t)
        entry = {"name": name, "dtype": wire, "shape": list(shape), "offset": list(offsets), "size": list(size), "_addr": addr}
        if device >= 0:
            entry["device"] = device
        layout.append(entry)
    return layout, keep


def send(sender, items, version, torch, np, wire_of):
    """One routed round on a sender: see Sender.send."""
    h = sender._handle()
    try:
        layout, keep = _shards(items, torch, np, wire_of, sender._cuda)
        for d in sorted({s["device"] for s in layout if "device" in s}):
            torch.cuda.current_stream(d).synchronize()  # the shards' writes are done before the library reads them
    except BaseException as e:
        sender._abort(f"rank {sender.rank}: building version {version} failed: {type(e).__name__}: {e}")
        raise
    addrs = array("Q", [s.pop("_addr") for s in layout])
    L = _lib.lib()
    ptr = ctypes.cast(addrs.buffer_info()[0], ctypes.POINTER(ctypes.c_uint64)) if addrs else None
    _lib.check(L.wc_send_shards(h, version, json.dumps(layout).encode(), ptr, len(layout)))
    sender._wait(lambda ms: L.wc_wait(h, ms))
    del keep, addrs
    return sender.last_round


def receive(receiver, torch):
    """One routed round on a receiver: a list of (name, view, global shape,
    offsets) once the round is committed; the views lie in the library's
    memory until the commit of the round after next."""
    from ._core import _NUMPY_OF, _CudaBuffer, _as_torch, _torch_dtypes
    import numpy as np
    h = receiver._handle()
    L = _lib.lib()
    _lib.check(L.wc_receive_shards(h))
    receiver._wait(lambda ms: L.wc_wait(h, ms))
    n = L.wc_shards(h, None, 0)
    _lib.check(n)
    buf = ctypes.create_string_buffer(n + 1)
    _lib.check(L.wc_shards(h, buf, n + 1))
    out = []
    tdt = {v: k for k, v in _torch_dtypes(torch).items()} if torch is not None else {}
    for s in json.loads(buf.value):
        shape, wire = tuple(s["size"]), s["dtype"]
        if s.get("device", -1) >= 0:
            dev = f"cuda:{s['device']}"
            if not s.get("nbytes", 0):
                t = torch.empty(shape, dtype=tdt[wire], device=dev)
            else:
                t = torch.as_tensor(_CudaBuffer(s["data"], s["nbytes"]), device=dev).view(tdt[wire]).view(shape)
            out.append((s["name"], t, tuple(s["shape"]), tuple(s["offset"])))
            continue
        npdt = np.dtype(_NUMPY_OF[wire])
        if s.get("nbytes", 0):
            arr = np.ctypeslib.as_array((ctypes.c_uint8 * s["nbytes"]).from_address(s["data"])).view(npdt).reshape(shape)
        else:
            arr = np.empty(shape, dtype=npdt)
        out.append((s["name"], _as_torch(arr, wire, torch) if torch is not None else arr, tuple(s["shape"]), tuple(s["offset"])))
    return out
