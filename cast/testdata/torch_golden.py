"""Compute reference digests of PyTorch's dtype conversions for cast's tests.

Run with a Python that has numpy and torch:

    python3 cast/testdata/torch_golden.py > golden.json

The inputs are built deterministically (the Go test builds the same ones);
each digest is the SHA-256 of the little-endian uint16 outputs. For NaN
inputs the outputs are first replaced by the value c10's scalar conversion
gives (bf16: 0x7FC0; f16: sign | 0x7E00), because PyTorch's vectorized CPU
kernels and its CUDA kernels spell NaN differently; the NaN spellings each
path produced are reported separately.
"""
import hashlib
import json
import sys

import numpy as np
import torch


def f32_inputs():
    i = np.arange(1 << 20, dtype=np.uint64)
    a = ((i * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    h = np.arange(1 << 16, dtype=np.uint32)
    lows = np.array([0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    b = ((h[:, None] << 16) | lows[None, :]).reshape(-1)
    s = np.arange(2, dtype=np.uint32)
    e = np.arange(96, 144, dtype=np.uint32)
    m = np.arange(1024, dtype=np.uint32)
    low = np.array([0, 0xFFF, 0x1000, 0x1001, 0x1FFF], dtype=np.uint32)
    c = ((s[:, None, None, None] << 31) | (e[None, :, None, None] << 23)
         | (m[None, None, :, None] << 13) | low[None, None, None, :]).reshape(-1)
    e = np.arange(98, 114, dtype=np.uint32)
    k = np.arange(1 << 16, dtype=np.uint32)
    low = np.array([0, 1], dtype=np.uint32)
    d = ((e[:, None, None] << 23) | (k[None, :, None] << 7) | low[None, None, :]).reshape(-1)
    return np.concatenate([a, b, c, d]).astype(np.uint32)


def digest(u16):
    return hashlib.sha256(u16.astype("<u2").tobytes()).hexdigest()


def conv(bits_tensor, dst, device):
    out = bits_tensor.to(device).to(dst).cpu()
    return out.view(torch.int16).numpy().view(np.uint16)


def canon(out, nan_mask, value):
    out = out.copy()
    out[nan_mask] = value[nan_mask] if isinstance(value, np.ndarray) else value
    return out


def nan_spellings(out, nan_mask):
    vals, counts = np.unique(out[nan_mask], return_counts=True)
    order = np.argsort(-counts)[:8]
    return {f"0x{int(vals[i]):04X}": int(counts[i]) for i in order}


def main():
    res = {"torch": torch.__version__, "numpy": np.__version__}
    x = f32_inputs()
    res["f32_count"] = int(x.size)
    res["f32_inputs_sha256"] = hashlib.sha256(x.astype("<u4").tobytes()).hexdigest()
    xf = torch.from_numpy(x.view(np.float32).copy())
    nan = np.isnan(x.view(np.float32))
    f16nan = ((x >> 16) & 0x8000).astype(np.uint16) | np.uint16(0x7E00)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        bf = conv(xf, torch.bfloat16, dev)
        hf = conv(xf, torch.float16, dev)
        res[f"{dev}_f32_to_bf16"] = digest(canon(bf, nan, np.uint16(0x7FC0)))
        res[f"{dev}_f32_to_f16"] = digest(canon(hf, nan, f16nan))
        res[f"{dev}_f32_to_bf16_nan"] = nan_spellings(bf, nan)
        res[f"{dev}_f32_to_f16_nan"] = nan_spellings(hf, nan)

    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ht = torch.from_numpy(h.view(np.float16).copy())
    bt = torch.from_numpy(h.view(np.int16).copy()).view(torch.bfloat16)
    hnan = np.isnan(h.view(np.float16))
    bnan = ((h & 0x7FFF) > 0x7F80)
    bsign = (h & 0x8000) | np.uint16(0x7E00)
    for dev in devices:
        o = conv(ht, torch.bfloat16, dev)
        res[f"{dev}_f16_to_bf16"] = digest(canon(o, hnan, np.uint16(0x7FC0)))
        res[f"{dev}_f16_to_bf16_nan"] = nan_spellings(o, hnan)
        o = conv(bt, torch.float16, dev)
        res[f"{dev}_bf16_to_f16"] = digest(canon(o, bnan, bsign))
        res[f"{dev}_bf16_to_f16_nan"] = nan_spellings(o, bnan)

    # NaN payloads through a one-element tensor (scalar loop) and a long one
    # (vectorized loop) on the CPU.
    probes = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FC12345, 0xFFFFFFFF]
    scal = {}
    for p in probes:
        one = torch.from_numpy(np.array([p], dtype=np.uint32).view(np.float32).copy())
        many = one.repeat(1024)
        scal[f"0x{p:08X}"] = {
            "bf16_one": f"0x{int(conv(one, torch.bfloat16, 'cpu')[0]):04X}",
            "bf16_many": f"0x{int(conv(many, torch.bfloat16, 'cpu')[0]):04X}",
            "f16_one": f"0x{int(conv(one, torch.float16, 'cpu')[0]):04X}",
            "f16_many": f"0x{int(conv(many, torch.float16, 'cpu')[0]):04X}",
        }
    res["cpu_nan_probes"] = scal
    json.dump(res, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
