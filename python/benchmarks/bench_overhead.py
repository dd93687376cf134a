"""The Python side's cost per tensor (target: at most 2 µs beyond the Go
path): 100,000 small torch CUDA tensors described for one round, timed in
the one function that does it (weightcast._core._describe: everything
send() does in Python before its single call into the library). Then the
same tensors sent for real to one receiver over ipc, for the whole round's
time. Prints one JSON line.

    python3 benchmarks/bench_overhead.py [count]
"""

import json
import os
import sys
import time

from _launch import emit, launch

COUNT = 100_000


def worker(count):
    import torch

    import weightcast
    from weightcast import _core

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(0)
    if rank == 0:
        flat = torch.randn(count * 256, device="cuda:0")
        named = [(f"layers.{i // 8}.p{i % 8}", flat[i * 256:(i + 1) * 256]) for i in range(count)]
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            _core._describe(named)
            best = min(best, time.perf_counter() - start)
        with weightcast.Sender(device="cuda:0", bucket="64MiB") as s:
            rounds = []
            for v in range(1, 4):
                start = time.perf_counter()
                s.send(named, v)
                rounds.append(time.perf_counter() - start)
            print(json.dumps({"describe_us_per_tensor": best / count * 1e6, "round_seconds": rounds, "transport": s.transport}), flush=True)
    else:
        with weightcast.Receiver(device="cuda:0", bucket="64MiB") as r:
            for _ in range(3):
                for _name, _t in r.receive():
                    pass


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else COUNT
    res = launch(os.path.abspath(__file__), 2, [str(count)])[0][0]
    us = res["describe_us_per_tensor"]
    emit(bench="python_overhead", tensors=count, us_per_tensor=round(us, 3), target_us=2.0, ok=us <= 2.0,
         round_seconds=[round(x, 4) for x in res["round_seconds"]], transport=res["transport"])


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(int(sys.argv[sys.argv.index("--worker") + 1]))
    else:
        main()
