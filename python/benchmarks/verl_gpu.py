"""The verl checkpoint engine (weightcast.verl) on one GPU, driven as verl's
CheckpointEngineManager drives it, every worker its own process:

  logits  a transformers Llama (random init, bf16, about 270M parameters)
          on the trainer and on 3 rollout workers, each its own copy; the
          trainer changes its weights each step, the rollouts copy what they
          receive into their own model; after each of 3 updates every
          rollout's logits on a fixed batch equal the trainer's, bit for bit.
  rate    the 8 GiB bf16 model of bench_sync.py (64 tensors of 128 MiB),
          1 GiB buckets, 3 rollout workers copying into their own tensors:
          the median update time of updates 2..4 through send_weights and
          receive_weights, in GB/s of model bytes (compare bench_sync.py's
          weightcast_gbps from the same run: target at least 0.95x of it).

    python3 benchmarks/verl_gpu.py [logits|rate|rate-nochecksum]...   # logits and rate by default

rate-nochecksum is rate with checksum=False on every rank: what the
receivers' separate checksum pass costs on the generator path.

Prints one JSON line per part.
"""

import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from verl_manager import Manager, Worker  # noqa: E402

ROLLOUTS = 3


def run(kind, steps, bucket, engine):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE), NCCL_NVLS_ENABLE="0",
               # the trainer's own process group, which the engine must not use
               RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1", LOCAL_RANK="0")
    spec = dict(model=kind, bucket=bucket, engine=dict({"host": "127.0.0.1", "timeout": 300.0}, **engine))
    trainer = Worker("trainer 0", dict(spec, master=True, seed=0), env)
    rollouts = [Worker(f"rollout {i}", dict(spec, seed=100 + i), env) for i in range(ROLLOUTS)]
    mgr = Manager([trainer], rollouts)
    results = []
    try:
        for step in range(1, steps + 1):
            mgr.form()
            mgr.transfer(step, seed=step)
            sent = trainer.ok("send_weights", timeout=400)
            got = [w.ok("receive_weights", timeout=400) for w in rollouts]
            mgr.finalize()
            results.append((sent, got))
        for w in [trainer] + rollouts:
            w.call("exit")
        for w in [trainer] + rollouts:
            w.ok("exit")
    finally:
        for w in [trainer] + rollouts:
            if w.proc.poll() is None:
                w.proc.kill()
            w.proc.wait()
    return results


def logits():
    res = run("llama", 3, 64 << 20, {"transport": "ipc"})
    equal = [all(g["logits"] == s["logits"] for g in got) for s, got in res]
    print(json.dumps({"bench": "verl_engine_llama_logits_3_rollouts_one_gpu", "updates": len(res), "logits_equal": equal,
                      "versions": [s["version"] for s, _ in res], "tensors": res[0][0]["metrics"]["tensors"],
                      "bytes": res[0][0]["metrics"]["bytes"]}), flush=True)
    return all(equal)


def rate(checksum=True):
    total = 64 * (128 << 20)
    res = run("bench", 4, 1 << 30, {"transport": "ipc", "rollout_dtype": "keep", "checksum": checksum})
    send = [s["metrics"]["seconds"] for s, _ in res]
    recv = [max(g["seconds"] for g in got) for _, got in res]
    print(json.dumps({"bench": "verl_engine_sync_8GiB_bf16_3_rollouts_one_gpu", "checksum": checksum, "bytes": total, "bucket": 1 << 30,
                      "send_seconds": [round(x, 4) for x in send],
                      "verl_engine_gbps": round(total / statistics.median(send[1:]) / 1e9, 1),
                      "slowest_receiver_gbps": round(total / statistics.median(recv[1:]) / 1e9, 1)}), flush=True)
    return True


if __name__ == "__main__":
    parts = sys.argv[1:] or ["logits", "rate"]
    ok = all([{"logits": logits, "rate": rate, "rate-nochecksum": lambda: rate(False)}[p]() for p in parts])
    sys.exit(0 if ok else 1)
