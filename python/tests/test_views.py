"""The views receive() hands out, built from batches made here as
wc_next_views describes them (no library, no other rank): every layout the
fast and the general paths meet — tensors back to back, gaps between them,
several dtypes and regions in one batch, a tensor out of order or
overlapping another (tied weights read in place in the sender's memory),
scalars, N-D shapes, tensors of no bytes, and dtypes this torch lacks."""

import ctypes
import struct

import numpy as np
import pytest

from weightcast import _core, _lib

torch = pytest.importorskip("torch")


class Batch:
    """A wc_views in memory of its own, from (name, region, offset, wire,
    shape) entries over numpy arrays as regions."""

    def __init__(self, regions, entries):
        self.arrays = regions
        views, names, dims = bytearray(), bytearray(), []
        for name, r, off, wire, shape in entries:
            nb = name.encode()
            nbytes = int(np.prod(shape, dtype=np.int64)) * _core._ITEMSIZE[wire]
            views += struct.pack("<qQQqqqqq", r if nbytes else -1, off, nbytes, _lib.dtype_code(wire), len(shape), len(dims), len(names), len(nb))
            names += nb
            dims += list(shape)
        regs = b"".join(struct.pack("<QQqq", a.ctypes.data, a.nbytes, -1, 0) for a in regions)
        self.bufs = [ctypes.create_string_buffer(bytes(x), max(len(x), 1)) for x in (views, regs, names, struct.pack(f"<{len(dims)}q", *dims))]
        b = self.b = _lib.Views()
        b.views, b.n = ctypes.addressof(self.bufs[0]), len(entries)
        b.regions, b.nregions = ctypes.addressof(self.bufs[1]), len(regions)
        b.names, b.names_len = ctypes.addressof(self.bufs[2]), len(names)
        b.dims, b.ndims = ctypes.addressof(self.bufs[3]), len(dims)

    def views(self, with_torch=True, regions=None):
        names, tensors = _core._views(self.b, torch if with_torch else None, {} if regions is None else regions)
        return list(zip(names, tensors))


def raw(region, off, wire, shape):
    """What a view of region at off should hold, as bytes."""
    n = int(np.prod(shape, dtype=np.int64)) * _core._ITEMSIZE[wire]
    return region[off:off + n].tobytes()


def as_bytes(t):
    if isinstance(t, np.ndarray):
        return t.tobytes()
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def check(batch, entries, **kw):
    got = batch.views(**kw)
    assert [n for n, _ in got] == [e[0] for e in entries]
    for (name, r, off, wire, shape), (_, t) in zip(entries, got):
        assert tuple(t.shape) == tuple(shape), name
        assert as_bytes(t) == raw(batch.arrays[r], off, wire, shape), name
    return dict(got)


def region(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_back_to_back_and_shapes():
    r = region(4096)
    entries = [("a", 0, 0, "F32", (16,)), ("b", 0, 64, "F32", (4, 4)), ("c", 0, 128, "F32", (2, 2, 4)), ("d", 0, 192, "F32", (16,))]
    got = check(Batch([r], entries), entries)
    assert got["a"].dtype == torch.float32
    # The views share the region's memory: no copies.
    assert got["b"].data_ptr() == r.ctypes.data + 64


def test_gaps_scalars_empties_and_dtypes():
    r = region(8192, 1)
    entries = [("s", 0, 0, "F32", ()), ("e", 0, 64, "BF16", (0, 3)), ("h", 0, 64, "BF16", (3, 5)), ("i", 0, 128, "I64", (7,)),
               ("b", 0, 192, "BOOL", (5,)), ("f8", 0, 256, "F8_E4M3", (9,)), ("u", 0, 320, "U8", (1,)), ("d", 0, 384, "F64", (2, 1))]
    r[192:197] &= 1  # valid bools
    got = check(Batch([r], entries), entries)
    assert got["h"].dtype == torch.bfloat16 and got["s"].dim() == 0 and got["e"].numel() == 0
    assert got["f8"].dtype == getattr(torch, "float8_e4m3fn", torch.uint8)


def test_out_of_order_overlapping_and_regions():
    """Read in place, views lie in several of the sender's allocations, in
    any order, and tied weights are one memory under two names."""
    r0, r1 = region(4096, 2), region(2048, 3)
    entries = [("w", 1, 512, "F16", (8, 8)), ("tied", 1, 512, "F16", (8, 8)), ("x", 0, 1000, "F32", (10,)), ("y", 0, 8, "F32", (3,)),
               ("z", 1, 0, "F16", (100,)), ("q", 0, 2048, "I32", (4, 4)), ("odd", 0, 3002, "F32", (3,))]
    got = check(Batch([r0, r1], entries), entries)
    assert got["w"].data_ptr() == got["tied"].data_ptr()


def test_mostly_gaps():
    r = region(64 * 200, 4)
    entries = [(f"t{i}", 0, 64 * i, "F32", (1 + i % 7,)) for i in range(200)]
    check(Batch([r], entries), entries)


def test_region_views_kept():
    r = region(1024, 5)
    entries = [("a", 0, 0, "F32", (8,))]
    regions = {}
    b = Batch([r], entries)
    b.views(regions=regions)
    kept = dict(regions)
    b.views(regions=regions)
    assert len(regions) == 1 and all(regions[k] is kept[k] for k in kept)


def test_numpy_without_torch():
    r = region(1024, 6)
    entries = [("a", 0, 0, "BF16", (4, 2)), ("b", 0, 64, "F8_E5M2", (3,)), ("c", 0, 128, "I16", (5,)), ("e", 0, 0, "F32", (0,))]
    got = check(Batch([r], entries), entries, with_torch=False)
    assert got["a"].dtype == np.uint16 and got["b"].dtype == np.uint8 and isinstance(got["c"], np.ndarray)


def test_dtype_torch_lacks():
    """U16 before torch 2.3 comes as a numpy array from a host bucket; on a
    torch that has it, as a torch tensor."""
    r = region(256, 7)
    entries = [("u", 0, 0, "U16", (4,)), ("f", 0, 64, "F32", (2,))]
    got = check(Batch([r], entries), entries)
    assert isinstance(got["u"], np.ndarray) != hasattr(torch, "uint16")
    assert isinstance(got["f"], torch.Tensor)
