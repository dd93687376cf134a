"""The Python side's cost per tensor (target: under 1.5 µs, the median of
five runs of this script), both ways, 100,000 small torch tensors:

  send     the one function that describes a round for the library
           (weightcast._core._describe: everything send() does in Python
           before its single call into the library), best of 5, timed
           once both ranks have joined;
  receive  the Python work of a receive() loop (`for name, t in
           r.receive(): pass`): the loop's time less the time spent in the
           library's calls that hand over each bucket (waiting for it
           included), best of 5 rounds; and, within it, the building of
           each bucket's views (receive_views_us_per_tensor).

Wall-clock figures (us_per_tensor, receive_us_per_tensor: the targets'),
and beside them the same in the timing thread's CPU time (cpu_...), which
other processes of a crowded machine disturb less. Then the same tensors
sent for real, for the whole round's time. With a
GPU the tensors are torch CUDA tensors on cuda:0 (transport auto: ipc);
without one, or with --cpu, torch CPU tensors over tcp with host buckets,
whose views are built by the same code but on a host bucket. Prints one
JSON line.

    python3 benchmarks/bench_overhead.py [--cpu] [count]
"""

import json
import os
import sys
import time
import types

from _launch import emit, launch

COUNT = 100_000
ROUNDS = 5


def worker(count, cpu):
    import torch

    import weightcast
    from weightcast import _core, _lib

    rank = int(os.environ["RANK"])
    device = "cpu" if cpu else "cuda:0"
    opts = dict(device=device, bucket="64MiB")
    if cpu:
        opts["transport"] = "tcp"
    else:
        torch.cuda.set_device(0)
    if rank == 0:
        flat = torch.randn(count * 256, device=device)
        named = [(f"layers.{i // 8}.p{i % 8}", flat[i * 256:(i + 1) * 256]) for i in range(count)]
        with weightcast.Sender(**opts) as s:
            # Timed once every rank has joined, so that the receiver's
            # start (importing torch, loading the library) does not run
            # beside it; the receiver then waits in the library.
            best = cpu = float("inf")
            for _ in range(5):
                start, start_cpu = time.perf_counter(), time.thread_time()
                _core._describe(named)
                best = min(best, time.perf_counter() - start)
                cpu = min(cpu, time.thread_time() - start_cpu)
            rounds = []
            for v in range(1, ROUNDS + 1):
                start = time.perf_counter()
                s.send(named, v)
                rounds.append(time.perf_counter() - start)
            print(json.dumps({"describe_us_per_tensor": best / count * 1e6, "describe_cpu_us_per_tensor": cpu / count * 1e6,
                              "round_seconds": rounds, "transport": s.transport}), flush=True)
    else:
        # The Python side of the loop: its whole time less the time spent
        # in the library's calls that hand over the buckets (waiting for
        # them included); and, within it, the function that turns a batch
        # the library filled into views, wherever it is called from (a
        # generator of pairs is consumed whole).
        L = _lib.lib()
        spent, views = [0.0, 0.0], [0.0]  # wall and CPU time in the calls; wall time building views
        for fn in ("wc_next", "wc_next_views"):
            if hasattr(L, fn):
                setattr(L, fn, _timed(getattr(L, fn), spent))
        orig = _core._views

        def timed(*args):
            start = time.perf_counter()
            out = orig(*args)
            if isinstance(out, types.GeneratorType):
                out = list(out)
            views[0] += time.perf_counter() - start
            return out

        _core._views = timed
        python, python_cpu, view_us, loops = [], [], [], []
        with weightcast.Receiver(**opts) as r:
            for _ in range(ROUNDS):
                spent[0], spent[1], views[0], n = 0.0, 0.0, 0.0, 0
                start, start_cpu = time.perf_counter(), time.thread_time()
                for _name, _t in r.receive():
                    n += 1
                loops.append(time.perf_counter() - start)
                python.append((loops[-1] - spent[0]) / max(n, 1) * 1e6)
                python_cpu.append((time.thread_time() - start_cpu - spent[1]) / max(n, 1) * 1e6)
                view_us.append(views[0] / max(n, 1) * 1e6)
        print(json.dumps({"python_us_per_tensor": min(python), "python_cpu_us_per_tensor": min(python_cpu), "views_us_per_tensor": min(view_us),
                          "loop_seconds": loops, "tensors": n}), flush=True)


def _timed(fn, spent):
    def call(*args):
        start, start_cpu = time.perf_counter(), time.thread_time()
        try:
            return fn(*args)
        finally:
            spent[0] += time.perf_counter() - start
            spent[1] += time.thread_time() - start_cpu
    return call


def main():
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    count = int(args[0]) if args else COUNT
    cpu = "--cpu" in sys.argv
    if not cpu:
        try:
            import torch
            cpu = not torch.cuda.is_available()
        except ImportError:
            raise SystemExit("bench_overhead.py needs torch") from None
    out = launch(os.path.abspath(__file__), 2, [str(count)] + (["--cpu"] if cpu else []))
    send, recv = out[0][0], out[1][0]
    us, rus = send["describe_us_per_tensor"], recv["python_us_per_tensor"]
    emit(bench="python_overhead", device="cpu" if cpu else "cuda:0", tensors=count,
         us_per_tensor=round(us, 3), receive_us_per_tensor=round(rus, 3), receive_views_us_per_tensor=round(recv["views_us_per_tensor"], 3),
         cpu_us_per_tensor=round(send["describe_cpu_us_per_tensor"], 3), receive_cpu_us_per_tensor=round(recv["python_cpu_us_per_tensor"], 3),
         target_us=1.5, ok=us < 1.5 and rus < 1.5,
         round_seconds=[round(x, 4) for x in send["round_seconds"]],
         receive_loop_seconds=[round(x, 4) for x in recv["loop_seconds"]], transport=send["transport"])


if __name__ == "__main__":
    if "--worker" in sys.argv:
        worker(int(sys.argv[sys.argv.index("--worker") + 1]), "--cpu" in sys.argv)
    else:
        main()
