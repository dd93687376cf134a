"""Start the ranks of a benchmark or GPU test as processes of this host,
torchrun style (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RUN_ID; rank 0 serves the rendezvous), and collect the JSON
lines they print."""

import json
import os
import socket
import subprocess
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the weightcast package next to this folder


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script, world, args=(), timeout=540, env=None):
    """Run `script --worker args...` as world ranks; return each rank's JSON
    lines (lists of dicts). Raises when a rank fails, with its output."""
    port, run = free_port(), uuid.uuid4().hex[:12]
    procs = []
    for rank in range(world):
        e = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                 TORCHELASTIC_RUN_ID=run, PYTHONPATH=os.path.dirname(HERE), NCCL_NVLS_ENABLE="0")
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, script, "--worker", *args], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    failed = []
    for rank, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            stdout, stderr = p.communicate()
            failed.append(f"rank {rank} timed out")
        lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        out.append(lines)
        if p.returncode != 0:
            failed.append(f"rank {rank} exited {p.returncode}:\n{stderr[-4000:]}")
    if failed:
        raise SystemExit("\n".join(failed))
    return out


def emit(**kw):
    print(json.dumps(kw), flush=True)
