"""One rank of a routed test group (test_routed.py), as its own process.

    python3 routed_worker.py '<json spec>'

Senders hold torch.chunk's dim-0 shard of every tensor of a small
Llama-shaped model (as FSDP does) and send it as (name, local, shape,
offsets); receivers take their tensor-parallel shard and report, per
version, whether every shard equals its slice of the full weights, and the
bytes they received. JSON lines on stdout.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

import weightcast  # noqa: E402

HEADS, KV_HEADS = 4, 2


def model(version):
    """The full weights of version: name -> bf16 tensor."""
    g = torch.Generator().manual_seed(version)
    shapes = {"model.embed_tokens.weight": (64, 32), "model.norm.weight": (32,), "lm_head.weight": (64, 32)}
    for l in range(2):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (32,), p + "self_attn.q_proj.weight": (32, 32),
                       p + "self_attn.k_proj.weight": (16, 32), p + "self_attn.v_proj.weight": (16, 32),
                       p + "self_attn.o_proj.weight": (32, 32), p + "post_attention_layernorm.weight": (32,),
                       p + "mlp.gate_proj.weight": (48, 32), p + "mlp.up_proj.weight": (48, 32), p + "mlp.down_proj.weight": (32, 48)})
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in shapes.items()}


def tp_slice(name, shape, r, tp):
    """The slice of a tensor that TP rank r of tp holds, as vLLM slices
    Llama: q, gate, up and the vocabulary split rows, o and down columns,
    k and v by their heads (replicated over tp // KV_HEADS ranks when tp
    exceeds them), norms whole."""
    whole = tuple(slice(0, d) for d in shape)
    if tp == 1 or "norm" in name:
        return whole
    rows = shape[0]
    if name.endswith(("k_proj.weight", "v_proj.weight")):
        per = rows // KV_HEADS
        head = r // max(tp // KV_HEADS, 1) if tp > KV_HEADS else None
        if head is not None:
            return (slice(head * per, (head + 1) * per),) + whole[1:]
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        n = shape[1] // tp
        return (whole[0], slice(r * n, (r + 1) * n))
    n = rows // tp
    return (slice(r * n, (r + 1) * n),) + whole[1:]


def say(**kw):
    print(json.dumps(kw), flush=True)


def main():
    spec = json.loads(sys.argv[1])
    senders, rank = spec["senders"], int(os.environ["RANK"])
    opts = dict(spec.get("options", {}))
    opts.setdefault("device", "cpu")  # the host path, also on a machine with a GPU
    try:
        if rank < senders:
            with weightcast.Sender(senders=senders, **opts) as s:
                for v in spec["versions"]:
                    shards = []
                    for name, t in model(v).items():
                        parts = torch.chunk(t, senders, dim=0)
                        if rank < len(parts):
                            off = sum(p.shape[0] for p in parts[:rank])
                            shards.append((name, parts[rank], tuple(t.shape), (off,) + (0,) * (t.dim() - 1)))
                    st = s.send(shards, v)
                    say(event="round", version=v, stats=st)
            return
        tp = spec["tp"]
        me = (rank - senders) % tp
        with weightcast.Receiver(senders=senders, tp=tp, heads=HEADS, kv_heads=KV_HEADS, **opts) as r:
            for v in spec["versions"]:
                full = model(v)
                want = {n: tp_slice(n, tuple(t.shape), me, tp) for n, t in full.items()}
                if spec.get("mode") == "load_into":
                    dst = {n: torch.zeros_like(full[n][want[n]]) for n in full}
                    r.load_into(dst)
                    got = [(n, t, want[n]) for n, t in dst.items()]
                else:
                    got = []
                    for sh in r.receive_shards():
                        at = tuple(slice(o, o + k) for o, k in zip(sh.offsets, sh.tensor.shape))
                        got.append((sh.name, sh.tensor, at if tuple(sh.shape) == tuple(full[sh.name].shape) else None))
                equal = len(got) == len(full) and all(at == want[n] and torch.equal(full[n][at], t) for n, t, at in got)
                nbytes = sum(t.numel() * 2 for _, t, _ in got)
                say(event="round", version=r.version, equal=equal, bytes=nbytes, stats=r.last_round)
    except weightcast.Error as e:
        say(event="error", type=type(e).__name__, text=str(e))
        sys.exit(1)


if __name__ == "__main__":
    main()
