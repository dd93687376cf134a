#!/usr/bin/env python3
"""Plain-PyTorch peers of weightcast's colocated sync, for comparison: one
sender and R receivers, processes sharing one GPU, moving a model of
--size bytes of bf16 in --tensors tensors, round after round.

  --mode bucket  The sender packs its parameters into two bucket buffers of
                 --bucket bytes, shared once with every receiver by CUDA IPC
                 (torch.multiprocessing); each receiver copies every bucket
                 into its own parameters and acknowledges. Two buckets are in
                 flight: the sender packs one while the receivers copy the
                 other.
  --mode direct  The sender shares its parameter tensors once by CUDA IPC;
                 every receiver copies each parameter straight into its own
                 storage, all receivers at once.

A round runs from the sender's first copy to the last receiver's
acknowledgement; the parameters take new values before each round, outside
the timing. After the last round every receiver checks every parameter.
Prints one JSON line: the round seconds and the per-receiver rate (model
bytes over round seconds, GB/s = 1e9 bytes/s), the median of rounds 2..N.

    python3 torch_peers.py --mode bucket --receivers 3 --size 8GiB --tensors 300 --bucket 1GiB --rounds 5
"""

import argparse
import json
import os
import statistics
import sys
import time

UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(s):
    t = s.strip().upper()
    num = t.rstrip("KMGIB")
    unit = t[len(num):]
    if unit not in UNITS or not num:
        raise argparse.ArgumentTypeError(f"{s!r} is no size: write 8GiB, 256MiB, 1024")
    return int(float(num) * UNITS[unit])


def shapes_of(size, tensors):
    """--tensors equal 1-D bf16 shapes (2 bytes each) adding up to about size."""
    each = max(1, size // tensors // 2)
    return [(each,) for _ in range(tensors)]


def plan_buckets(nbytes, bucket):
    """Greedy buckets of (tensor, offset, bytes), offsets aligned to 256
    bytes; a tensor larger than a bucket is refused (the peer does not
    split)."""
    out, cur, fill = [], [], 0
    for i, n in enumerate(nbytes):
        if n > bucket:
            raise SystemExit(f"tensor {i} of {n} bytes does not fit in a {bucket}-byte bucket")
        off = (fill + 255) & ~255
        if cur and off + n > bucket:
            out.append(cur)
            cur, off = [], 0
        cur.append((i, off, n))
        fill = off + n
    if cur:
        out.append(cur)
    return out


def value(rnd, i):
    """The value every element of tensor i holds in round rnd: small integers,
    exact in bf16, different from one tensor and round to the next."""
    return float((rnd * 7 + i) % 200 - 100)


def receiver(conn, mode, shapes, device):
    import torch

    torch.cuda.set_device(device)
    params = [torch.empty(s, dtype=torch.bfloat16, device="cuda") for s in shapes]
    flats = [p.view(-1).view(torch.uint8) for p in params]
    shared = conn.recv()  # bucket: the two buffers; direct: the sender's parameters
    conn.send("ready")
    stream = torch.cuda.current_stream()
    while True:
        msg = conn.recv()
        if msg[0] == "bucket":
            _, b, entries = msg
            src = shared[b]
            for i, off, n in entries:
                flats[i].copy_(src[off : off + n])
            stream.synchronize()
            conn.send("done")
        elif msg[0] == "round":
            for p, s in zip(params, shared):
                p.copy_(s)
            stream.synchronize()
            conn.send("done")
        elif msg[0] == "check":
            bad = [i for i, (p, v) in enumerate(zip(params, msg[1])) if not bool((p == v).all())]
            conn.send(bad)
        else:
            break


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["bucket", "direct"], required=True)
    ap.add_argument("--receivers", type=int, default=3)
    ap.add_argument("--size", type=parse_size, default=8 << 30)
    ap.add_argument("--tensors", type=int, default=300)
    ap.add_argument("--bucket", type=parse_size, default=1 << 30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()
    if args.rounds < 2:
        raise SystemExit("--rounds must be at least 2: the rate is the median of rounds 2..N")

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import torch
    import torch.multiprocessing as mp

    torch.cuda.set_device(args.device)
    shapes = shapes_of(args.size, args.tensors)
    params = [torch.empty(s, dtype=torch.bfloat16, device="cuda") for s in shapes]
    flats = [p.view(-1).view(torch.uint8) for p in params]
    nbytes = [f.numel() for f in flats]
    total = sum(nbytes)
    buckets = plan_buckets(nbytes, args.bucket) if args.mode == "bucket" else []
    bufs = [torch.empty(args.bucket, dtype=torch.uint8, device="cuda") for _ in range(2)] if args.mode == "bucket" else []

    ctx = mp.get_context("spawn")
    conns, procs = [], []
    for _ in range(args.receivers):
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=receiver, args=(theirs, args.mode, shapes, args.device), daemon=True)
        p.start()
        conns.append(mine)
        procs.append(p)
    for c in conns:
        c.send(bufs if args.mode == "bucket" else params)  # shared once, by CUDA IPC
    for c in conns:
        if c.recv() != "ready":
            raise SystemExit("a receiver did not start")

    stream = torch.cuda.current_stream()
    seconds = []
    for rnd in range(1, args.rounds + 1):
        for i, p in enumerate(params):
            p.fill_(value(rnd, i))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if args.mode == "direct":
            for c in conns:
                c.send(("round",))
            for c in conns:
                c.recv()
        else:
            acked = 0  # buckets every receiver has acknowledged
            for k, entries in enumerate(buckets):
                while acked < k - 1:  # bucket k - 2's buffer is still being read
                    for c in conns:
                        c.recv()
                    acked += 1
                buf = bufs[k % 2]
                for i, off, n in entries:
                    buf[off : off + n].copy_(flats[i])
                stream.synchronize()
                for c in conns:
                    c.send(("bucket", k % 2, entries))
            while acked < len(buckets):
                for c in conns:
                    c.recv()
                acked += 1
        seconds.append(time.perf_counter() - t0)

    want = [value(args.rounds, i) for i in range(len(params))]
    for c in conns:
        c.send(("check", want))
    bad = [c.recv() for c in conns]
    for c in conns:
        c.send(("stop",))
    for p in procs:
        p.join(timeout=60)
    if any(bad):
        raise SystemExit(f"receivers hold wrong values in tensors {bad}")
    out = {
        "peer": args.mode,
        "receivers": args.receivers,
        "bytes": total,
        "tensors": len(params),
        "bucket": args.bucket if args.mode == "bucket" else None,
        "seconds": [round(s, 6) for s in seconds],
        "gbps": round(total / statistics.median(seconds[1:]) / 1e9, 1),
        "verified": True,
        "device": torch.cuda.get_device_name(args.device),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
