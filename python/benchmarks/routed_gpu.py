"""Routed sync on one GPU: 4 trainer processes each holding a dim-0 shard
(torch.chunk, as FSDP) of every weight, 4 rollout processes each taking its
tensor-parallel shard (TP 4), over ipc; every process on cuda:0.

  check  a transformers Llama (random weights, bf16): after each of 3
         updates every rollout rank's shards equal the slices of the full
         weights that vLLM's TP slicing gives its rank (sizes checked too);
         the trainer ranks hand their shards as (name, local, shape,
         offsets), then, a second run, as DTensors sharded along dim 0
         (torch.distributed.tensor on a gloo group, FSDP2's placement);
  rate   a synthetic 8 GiB bf16 model (64 tensors of 64 Mi elements, 8192 x
         8192 rows named as Llama projections): the routed round against
         the broadcast of the whole model from one sender to 4 receivers
         (load_into), with 256 MiB buckets per pair (a rank holds two per
         peer) and 1 GiB for the broadcast, checksums on, median of
         3 rounds after a warm-up; time per round (the routed round from
         the moment every rank is in it: last_round's seconds less
         waited) and bytes per receiver.

Prints one JSON line per mode.

    python3 benchmarks/routed_gpu.py [check|rate]
"""

import json
import os
import statistics
import sys
import time

from _launch import emit, launch

SENDERS, RECEIVERS, TP = 4, 4, 4
ROUNDS = 4  # the first is a warm-up
BUCKET = 1 << 30  # the broadcast's
ROUTED_BUCKET = 256 << 20  # each pair's two (a rank holds 2 x 4 of them)


def llama(torch, version):
    """The full weights of version: a small transformers Llama, the same on
    every rank, shifted by the version."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                      num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False)
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    return cfg, {n: (t.detach() + version * 0.001).to("cuda").contiguous() for n, t in m.state_dict().items()}


def synthetic(torch, version, keep=lambda name, t: t):
    """8 GiB of bf16 in 64 tensors of 8192 x 8192, as column- and
    row-parallel projections, the same on every rank; keep(name, tensor)
    says what a rank keeps of each (its shard), made one tensor at a time
    so that no rank holds the whole model but the broadcast's."""
    g = torch.Generator(device="cuda").manual_seed(version)
    names = ["q_proj", "o_proj", "gate_proj", "down_proj"]
    out = {}
    for i in range(64):
        name = f"model.layers.{i // 4}.{'self_attn' if i % 4 < 2 else 'mlp'}.{names[i % 4]}.weight"
        out[name] = keep(name, torch.randn(8192, 8192, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16))
    return out


def shards(torch, full, rank):
    out = []
    for name, t in full.items():
        parts = torch.chunk(t, SENDERS, dim=0)
        if rank < len(parts):
            off = sum(p.shape[0] for p in parts[:rank])
            out.append((name, parts[rank].contiguous(), tuple(t.shape), (off,) + (0,) * (t.dim() - 1)))
    return out


def dtensors(torch, full, rank):
    """(name, DTensor) items: each weight sharded along dim 0 over the
    senders by torch.distributed.tensor (FSDP2's placement), on a gloo
    group of the senders, local shards on the CPU (the library copies them
    to the rank's GPU)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor
    if not dist.is_initialized():
        port = int(os.environ["MASTER_PORT"]) + 1
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=SENDERS)
    mesh = DeviceMesh("cpu", list(range(SENDERS)))
    return [(n, distribute_tensor(t.cpu(), mesh, [Shard(0)])) for n, t in full.items()]


def expected(name, shape, r, kv_heads):
    """The slice vLLM's TP slicing gives TP rank r of TP of a Llama tensor."""
    whole = tuple(slice(0, d) for d in shape)
    if "norm" in name:
        return whole
    if name.endswith(("k_proj.weight", "v_proj.weight")) and TP > kv_heads:
        per = shape[0] // kv_heads
        h = r // (TP // kv_heads)
        return (slice(h * per, (h + 1) * per),) + whole[1:]
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        n = shape[1] // TP
        return (whole[0], slice(r * n, (r + 1) * n))
    n = shape[0] // TP
    return (slice(r * n, (r + 1) * n),) + whole[1:]


def worker(mode, how):
    import torch

    import weightcast

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    make = (lambda v: llama(torch, v)) if mode == "check" else (lambda v: (None, synthetic(torch, v)))
    rounds = 3 if mode == "check" else ROUNDS
    if how == "broadcast":
        _, full = make(1)
        if rank == 0:
            with weightcast.Sender(device="cuda:0", bucket=BUCKET, transport="ipc") as s:
                times = []
                for v in range(1, rounds + 1):
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    s.send(full.items(), v)
                    times.append(time.perf_counter() - start)
                emit(seconds=times, bytes=s.last_round["bytes"])
        else:
            dst = {n: torch.empty_like(t) for n, t in full.items()}
            del full
            with weightcast.Receiver(device="cuda:0", bucket=BUCKET, transport="ipc") as r:
                for _ in range(rounds):
                    r.load_into(dst)
                emit(bytes_received=r.last_round["bytes"])
        return
    if mode == "rate":
        cfg, heads, kv = None, TP, TP
        if rank < SENDERS:
            def chunk(name, t):
                return torch.chunk(t, SENDERS, dim=0)[rank].clone()
            mine = [(n, t, (8192, 8192), (rank * (8192 // SENDERS), 0)) for n, t in synthetic(torch, 1, chunk).items()]
        full = {}
    else:
        cfg, full = make(1)
        kv, heads = cfg.num_key_value_heads, cfg.num_attention_heads
        if rank < SENDERS:
            mine = shards(torch, full, rank) if how != "dtensor" else dtensors(torch, full, rank)
    if rank < SENDERS:
        del full
        with weightcast.Sender(device="cuda:0", bucket=ROUTED_BUCKET, transport="ipc", senders=SENDERS) as s:
            times = []
            for v in range(1, rounds + 1):
                if mode == "check" and v > 1:
                    mine = shards(torch, make(v)[1], rank) if how != "dtensor" else dtensors(torch, make(v)[1], rank)
                torch.cuda.synchronize()
                st = s.send(mine, v)
                # From the moment every rank was in the round to its
                # commit: a sender that starts late is not the transfer.
                times.append(st["seconds"] - st["waited"])
            emit(seconds=times, bytes_sent=st["bytes_sent"])
        return
    del full
    me = (rank - SENDERS) % TP
    with weightcast.Receiver(device="cuda:0", bucket=ROUTED_BUCKET, transport="ipc", senders=SENDERS, tp=(me, TP),
                             heads=heads, kv_heads=kv) as r:
        results = []
        for v in range(1, rounds + 1):
            got = r.receive_shards()
            rec = {"version": r.version, "bytes": sum(sh.tensor.numel() * sh.tensor.element_size() for sh in got),
                   "bytes_received": r.last_round["bytes_received"]}
            if mode == "check":
                ref = make(v)[1]
                bad = []
                for sh in got:
                    at = tuple(slice(o, o + k) for o, k in zip(sh.offsets, sh.tensor.shape))
                    want = expected(sh.name, tuple(ref[sh.name].shape), me, kv)
                    if at != want or not torch.equal(ref[sh.name][at], sh.tensor):
                        bad.append(sh.name)
                rec.update(tensors=len(got), of=len(ref), differ=bad[:5], equal=not bad and len(got) == len(ref))
                del ref
            results.append(rec)
        emit(rounds=results)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    mode = sys.argv[1] if len(sys.argv) > 1 else "check"
    me = os.path.abspath(__file__)
    routed = launch(me, SENDERS + RECEIVERS, [mode, "routed"])
    out = {"mode": mode, "senders": SENDERS, "receivers": RECEIVERS, "tp": TP}
    rcv = [lines[-1]["rounds"] for lines in routed[SENDERS:]]
    out["routed_bytes_per_receiver"] = max(r[-1]["bytes_received"] for r in rcv)
    out["routed_seconds"] = routed[0][-1]["seconds"]
    out["routed_bytes_sent"] = [lines[-1]["bytes_sent"] for lines in routed[:SENDERS]]
    if mode == "check":
        out["equal"] = all(rec["equal"] for r in rcv for rec in r)
        out["versions"] = [[rec["version"] for rec in r] for r in rcv]
        out["differ"] = [rec["differ"] for r in rcv for rec in r if rec["differ"]][:3]
        dt = launch(me, SENDERS + RECEIVERS, [mode, "dtensor"])
        out["dtensor_equal"] = all(rec["equal"] for lines in dt[SENDERS:] for rec in lines[-1]["rounds"])
    else:
        out["routed_median_s"] = statistics.median(out["routed_seconds"][1:])
        bc = launch(me, RECEIVERS + 1, [mode, "broadcast"])
        out["broadcast_seconds"] = bc[0][-1]["seconds"]
        out["broadcast_median_s"] = statistics.median(out["broadcast_seconds"][1:])
        out["broadcast_bytes_per_receiver"] = bc[1][-1]["bytes_received"]
        out["routed_over_broadcast_time"] = out["routed_median_s"] / out["broadcast_median_s"]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
