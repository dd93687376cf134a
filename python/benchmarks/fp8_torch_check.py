"""weightcast's block-scaled FP8 against torch, bit for bit, on the linear
weights of a transformers model (a small LlamaConfig, randomly initialised,
in BF16). The trainer (rank 0) sends the model with quantize="fp8-block";
the receiver compares every received tensor with torch's own quantization
of the same weight, computed from the rule on the GPU when there is one
(else on the CPU):

    amax = W.float().abs().amax() per 128x128 block
    s    = amax / 448   correctly rounded to float32; 1 where s < 2**-126
    code = (W.float() / s).to(torch.float8_e4m3fn)

s is computed as (amax.double() / 448).float(): a float32 quotient worked
in float64 and rounded once to float32 is the correctly rounded one, on any
device. Not amax / 448.0: on CUDA, torch divides a tensor by a CPU scalar
as a multiplication by the scalar's reciprocal, which is an ulp off in some
blocks (the JSON line counts them, "torch_scalar_div_scales_differ", for
information). The codes divide tensor by tensor (IEEE on CUDA and CPU).

codes and scales compared as bits; weights weightcast does not quantize
(embeddings, norms, lm_head) must arrive unchanged. The weights are
perturbed so that some blocks are all zeros, some hold one huge value and
some lie in the subnormal code range. Prints one JSON line; exits 1 on a
mismatch, 0 with "skipped" where torch lacks float8_e4m3fn (torch < 2.1).

With --gpu the trainer's model lives on cuda:0 and both ranks use device
buckets there (transport ipc), so weightcast quantizes the weights with its
GPU kernel; without it, host memory over tcp and the CPU path.

    python3 benchmarks/fp8_torch_check.py [--gpu]
"""

import json
import os
import sys

from _launch import emit, launch


def model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=4096, hidden_size=384, intermediate_size=1000, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(1)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        p = dict(m.named_parameters())
        q = p["model.layers.0.self_attn.q_proj.weight"]
        q[:128, :128] = 0                   # a block of zeros
        q[128:256, :128] *= 1e-3
        q[130, 5] = 3e4                     # one huge value: the rest in the subnormal codes
        p["model.layers.1.mlp.down_proj.weight"][:, :64] *= 2.0 ** -120  # tiny blocks: s = 1
    return m


def reference(w):
    """torch's block-scaled FP8 of a 2-D weight: codes (uint8 view), scales
    (int32 view of the float32 bits), and how many of the scales torch's
    own amax / 448.0 on the device gives differently."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = w.to(dev).float()
    rows, cols = x.shape
    br, bc = (rows + 127) // 128, (cols + 127) // 128
    pad = torch.zeros(br * 128, bc * 128, device=dev)
    pad[:rows, :cols] = x.abs()
    amax = pad.view(br, 128, bc, 128).amax(dim=(1, 3))
    s = scales_of(amax)
    naive = int((scales_of(amax, torch_div=True).view(torch.int32) != s.view(torch.int32)).sum())
    full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    codes = (x / full).to(torch.float8_e4m3fn)
    return codes.view(torch.uint8).cpu(), s.view(torch.int32).cpu(), naive


def scales_of(amax, torch_div=False):
    """The float32 scales of blocks with largest magnitudes amax (float32):
    amax / 448 correctly rounded, 1 where that is below 2**-126; with
    torch_div, torch's amax / 448.0 on amax's device instead."""
    import torch

    s = amax / 448.0 if torch_div else (amax.double() / 448).float()
    return torch.where(s < 2.0 ** -126, torch.ones_like(s), s)


def worker():
    import torch

    import weightcast

    if not hasattr(torch, "float8_e4m3fn"):
        print(json.dumps({"skipped": f"torch {torch.__version__} has no float8_e4m3fn"}), flush=True)
        return
    rank = int(os.environ["RANK"])
    gpu = "--gpu" in sys.argv
    where = dict(device="cuda:0", transport="ipc") if gpu else dict(device="cpu", transport="tcp")
    m = model()
    params = {n: p.detach() for n, p in m.named_parameters()}
    if rank == 0:
        sent = {n: p.to("cuda:0") for n, p in params.items()} if gpu else params
        with weightcast.Sender(bucket="8MiB", quantize="fp8-block", **where) as s:
            s.send(sent.items(), 1)
        print(json.dumps({"sent": len(params)}), flush=True)
        return
    got = {}
    with weightcast.Receiver(bucket="8MiB", **where) as r:
        for name, t in r.receive():
            got[name] = torch.as_tensor(t).clone().cpu()
    bad, quantized, naive = [], 0, 0
    for name, w in params.items():
        linear = w.dim() == 2 and name.endswith("_proj.weight")
        if not linear:
            if name not in got or got[name].dtype != w.dtype or not torch.equal(got[name], w):
                bad.append(f"{name}: not sent as it was")
            continue
        quantized += 1
        codes, scales, n = reference(w)
        naive += n
        c, sc = got.get(name), got.get(name + "_scale_inv")
        if c is None or sc is None or c.dtype != torch.float8_e4m3fn or sc.dtype != torch.float32:
            bad.append(f"{name}: codes or scales missing ({None if c is None else c.dtype}, {None if sc is None else sc.dtype})")
            continue
        if not torch.equal(c.view(torch.uint8), codes):
            n = int((c.view(torch.uint8) != codes).sum())
            bad.append(f"{name}: {n} codes differ from torch's")
        if not torch.equal(sc.view(torch.int32), scales):
            bad.append(f"{name}: scales differ from torch's")
    print(json.dumps({"quantized": quantized, "bad": bad[:20], "torch": torch.__version__, "quantized_on": "gpu" if gpu else "cpu",
                      "reference_on": "cuda" if torch.cuda.is_available() else "cpu",
                      "torch_scalar_div_scales_differ": naive}), flush=True)


def main():
    out = launch(os.path.abspath(__file__), 2, args=[a for a in sys.argv[1:] if a == "--gpu"])
    recv = out[1][-1] if out[1] else {}
    if "skipped" in recv:
        emit(test="fp8_torch_check", ok=True, skipped=recv["skipped"])
        sys.exit(0)
    ok = bool(recv) and not recv.get("bad") and recv.get("quantized", 0) > 0
    emit(test="fp8_torch_check", ok=ok, **recv)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    worker() if "--worker" in sys.argv else main()
