"""An 8 GiB bf16 model (64 tensors of 128 MiB) synced from a torch trainer to
3 torch receivers on one GPU, three ways, each with 1 GiB buckets and the
receivers copying into their own parameters:

  weightcast  the Python package: Sender.send(model.named_parameters()),
              Receiver.load_into(params), transport ipc;
  demo        the demo binary on the same sizes (--transport ipc), for the
              Go path alone (target: weightcast >= 0.95x of it);
  torch       a plain-PyTorch peer written for the comparison:
              torch.multiprocessing shares two bucket buffers over CUDA IPC,
              the trainer fills one while the receivers copy out of the
              other (two buckets in flight), ordered by interprocess events.

Each reports the median of 3 timed rounds after one warm-up round, in GB/s
of model bytes per round. Prints one JSON line.

With --receive, the weightcast run's receivers also take rounds through
the receive() loop a rollout engine's load_weights runs (`for name, t in
r.receive(): params[name].copy_(t)`), interleaved round by round with
load_into in the same processes, and the line adds receive_gbps and
receive_vs_load_into (target: at least 0.9). --receivers N runs N
receivers instead of 3 (the demo and the peer too). --no-peers leaves out the demo
and the plain-PyTorch peer. --no-checksum turns the weightcast runs'
per-bucket checksums off (checksum=False on every rank), which shows what
the checks cost each mode.

    python3 benchmarks/bench_sync.py [--receive] [--receivers N] [--no-peers] [--no-checksum]   # the demo binary: $WEIGHTCAST_DEMO, else ../demo
"""

import json
import os
import statistics
import subprocess
import sys
import time

from _launch import HERE, emit, launch

TENSORS, EACH = 64, 128 << 20  # bytes per tensor
BUCKET = 1 << 30


def _receivers():
    """--receivers N, 3 by default."""
    if "--receivers" not in sys.argv:
        return 3
    try:
        n = int(sys.argv[sys.argv.index("--receivers") + 1])
    except (IndexError, ValueError):
        raise SystemExit("--receivers takes a number of receivers, for example --receivers 1") from None
    if n < 1:
        raise SystemExit(f"--receivers {n}: give at least one receiver")
    return n


RECEIVERS = _receivers()
ROUNDS = 4  # the first is a warm-up
TOTAL = TENSORS * EACH


def model(torch, seed, count=TENSORS):
    """The model's first count tensors (the same for a seed on every rank)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {f"layers.{i}.weight": torch.randn(EACH // 2, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16)
            for i in range(count)}


def weightcast_worker(modes, checksum=None):
    """One rank of the weightcast runs: ROUNDS rounds for each receiver
    mode of modes, interleaved (round v takes mode modes[(v - 1) % len]),
    so that the modes meet the same machine state; the sender prints each
    round's time. checksum is passed to the Sender and the Receivers."""
    import torch

    import weightcast

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    params = model(torch, rank)
    rounds = ROUNDS * len(modes)
    if rank == 0:
        with weightcast.Sender(device="cuda:0", bucket=BUCKET, transport="ipc", checksum=checksum) as s:
            times = []
            for v in range(1, rounds + 1):
                torch.cuda.synchronize()
                start = time.perf_counter()
                s.send(params.items(), v)
                times.append(time.perf_counter() - start)
            print(json.dumps({"seconds": times}), flush=True)
    else:
        with weightcast.Receiver(device="cuda:0", bucket=BUCKET, transport="ipc", checksum=checksum) as r:
            for v in range(1, rounds + 1):
                if modes[(v - 1) % len(modes)] == "receive":
                    # The loop a rollout engine's load_weights runs.
                    with torch.no_grad():
                        for name, t in r.receive():
                            params[name].copy_(t)
                else:
                    r.load_into(params)
            torch.cuda.synchronize()
            want = model(torch, 0, 2)
            ok = all(torch.equal(params[n], w) for n, w in want.items())
            print(json.dumps({"ok": ok}), flush=True)


def torch_receiver(rank, buckets, handles, inbox, acks):
    import torch

    torch.cuda.set_device(0)
    params = model(torch, rank)
    flat = {n: p.view(-1).view(torch.uint8) for n, p in params.items()}
    ready = [torch.cuda.Event.from_ipc_handle(0, h) for h in handles]
    stream = torch.cuda.Stream()
    while True:
        msg = inbox.get()
        if msg is None:
            break
        slot, layout = msg
        with torch.cuda.stream(stream):
            stream.wait_event(ready[slot])
            for name, off, n in layout:
                flat[name].copy_(buckets[slot][off:off + n])
        stream.synchronize()
        acks.put((rank, slot))


def torch_peer():
    """The plain-PyTorch comparison; returns the round times."""
    import torch
    import torch.multiprocessing as mp

    torch.cuda.set_device(0)
    params = model(torch, 0)
    flat = [(n, p.view(-1).view(torch.uint8)) for n, p in params.items()]
    buckets = [torch.empty(BUCKET, dtype=torch.uint8, device="cuda") for _ in range(2)]
    ready = [torch.cuda.Event(interprocess=True) for _ in range(2)]
    ctx = mp.get_context("spawn")
    inboxes = [ctx.Queue() for _ in range(RECEIVERS)]
    acks = ctx.Queue()
    procs = [ctx.Process(target=torch_receiver, args=(r + 1, buckets, [e.ipc_handle() for e in ready], inboxes[r], acks))
             for r in range(RECEIVERS)]
    for p in procs:
        p.start()
    # Layout: fill buckets in order, tensors whole (each fits).
    plan, cur, off = [], [], 0
    for name, t in flat:
        if off + t.numel() > BUCKET:
            plan.append(cur)
            cur, off = [], 0
        cur.append((name, t, off))
        off += t.numel()
    plan.append(cur)
    stream = torch.cuda.Stream()
    times = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        start = time.perf_counter()
        pending = [0, 0]  # acks still owed per slot
        for k, bucket in enumerate(plan):
            slot = k % 2
            while pending[slot]:
                _, s = acks.get()
                pending[s] -= 1
            with torch.cuda.stream(stream):
                for name, t, o in bucket:
                    buckets[slot][o:o + t.numel()].copy_(t)
                ready[slot].record(stream)
            for q in inboxes:
                q.put((slot, [(name, o, t.numel()) for name, t, o in bucket]))
            pending[slot] = RECEIVERS
        while pending[0] or pending[1]:
            _, s = acks.get()
            pending[s] -= 1
        times.append(time.perf_counter() - start)
    for q in inboxes:
        q.put(None)
    for p in procs:
        p.join(60)
    return times


def rate(seconds):
    return TOTAL / statistics.median(seconds[1:]) / 1e9


def main():
    modes = ["load_into", "receive"] if "--receive" in sys.argv else ["load_into"]
    unchecked = "--no-checksum" in sys.argv
    out = launch(os.path.abspath(__file__), 1 + RECEIVERS, [",".join(modes)] + (["--no-checksum"] if unchecked else []))
    seconds = out[0][0]["seconds"]
    by_mode = {m: seconds[i::len(modes)] for i, m in enumerate(modes)}
    wc = rate(by_mode["load_into"])
    checked = all(lines[0]["ok"] for lines in out[1:])
    extra = {}
    if "receive" in by_mode:
        rc = rate(by_mode["receive"])
        extra = dict(receive_gbps=round(rc, 1), receive_vs_load_into=round(rc / wc, 3), receive_target=0.9)
    if "--no-peers" in sys.argv:
        emit(bench=f"sync_8GiB_bf16_{RECEIVERS}_receivers_one_gpu", bytes=TOTAL, bucket=BUCKET, checksum=not unchecked, weightcast_gbps=round(wc, 1),
             receivers_checked=checked, **extra)
        return

    demo = os.environ.get("WEIGHTCAST_DEMO") or os.path.join(HERE, "..", "..", "demo")
    res = subprocess.run([demo, "--transport", "ipc", "--ranks", str(1 + RECEIVERS), "--size", str(TOTAL), "--tensors", str(TENSORS),
                          "--dtypes", "bf16", "--bucket", str(BUCKET), "--rounds", str(ROUNDS), "--verify=false", "--json"],
                         capture_output=True, text=True, timeout=540, env=dict(os.environ, NCCL_NVLS_ENABLE="0"))
    demo_gbps = None
    if res.returncode == 0:
        s = json.loads(res.stdout)
        demo_gbps = TOTAL / statistics.median(s["seconds"][1:]) / 1e9 if len(s.get("seconds", [])) > 1 else s.get("gbps")

    peer = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-peer", "--receivers", str(RECEIVERS)], capture_output=True, text=True, timeout=540)
    if peer.returncode != 0:
        raise SystemExit(f"the plain-PyTorch peer failed:\n{peer.stderr[-3000:]}")
    torch_gbps = rate(json.loads(peer.stdout.splitlines()[-1])["seconds"])
    emit(bench=f"sync_8GiB_bf16_{RECEIVERS}_receivers_one_gpu", bytes=TOTAL, bucket=BUCKET, weightcast_gbps=round(wc, 1), receivers_checked=checked,
         demo_gbps=demo_gbps and round(demo_gbps, 1), vs_demo=demo_gbps and round(wc / demo_gbps, 3), demo_target=0.95,
         torch_peer_gbps=round(torch_gbps, 1), vs_torch_peer=round(wc / torch_gbps, 3),
         demo_error=None if res.returncode == 0 else res.stderr[-1000:], **extra)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        weightcast_worker(sys.argv[sys.argv.index("--worker") + 1].split(","), False if "--no-checksum" in sys.argv else None)
    elif "--torch-peer" in sys.argv:
        print(json.dumps({"seconds": torch_peer()}), flush=True)
    else:
        main()
