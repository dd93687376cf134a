"""weightcast.vllm.WorkerExtension in stand-ins of vLLM's GPU workers (vLLM
is not installed here; vllm_worker.py follows its documented contract), each
a real process, fed by a trainer process sending torch tensors."""

import json
import os
import subprocess
import sys
import uuid

import pytest

torch = pytest.importorskip("torch")

import torchmodel  # noqa: E402
import vllm_worker  # noqa: E402
from conftest import HERE, PYTHON_DIR, Rank, free_port  # noqa: E402


class StandIn:
    """One stand-in worker process; rpc() is collective_rpc for one worker."""

    def __init__(self, spec):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "vllm_worker.py"), json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=dict(os.environ, PYTHONPATH=PYTHON_DIR), text=True)

    def send(self, method, **kwargs):
        self.proc.stdin.write(json.dumps({"method": method, "kwargs": kwargs}) + "\n")
        self.proc.stdin.flush()

    def result(self):
        line = self.proc.stdout.readline()
        assert line, f"the worker exited: {self.proc.stderr.read()[-2000:]}"
        return json.loads(line)


def collective_rpc(workers, method, **kwargs):
    """vLLM's LLM.collective_rpc: the method on every worker, results in worker order."""
    for w in workers:
        w.send(method, **kwargs)
    return [w.result() for w in workers]


@pytest.fixture
def stand_ins():
    started = []

    def launch(tp, **spec):
        ws = [StandIn(dict(spec, rank=r, tp=tp)) for r in range(tp)]
        started.extend(ws)
        return ws

    yield launch
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()


def trainer(versions):
    """The trainer: rank 0 of the group, serving the rendezvous itself."""
    port, run = free_port(), uuid.uuid4().hex[:12]
    spec = {"role": "sender", "model": "torch", "versions": versions, "bucket": 16 << 10,
            "options": {"rank": 0, "world_size": 3, "rendezvous": f"etcd://127.0.0.1:{port}", "run_id": run,
                        "serve_rendezvous": True, "transport": "tcp", "timeout": 30.0, "group": "vllm-" + run}}
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return Rank(0, spec, dict(env, PYTHONPATH=PYTHON_DIR)), spec["options"]


def want(version, rank, tp):
    full = dict(torchmodel.weights(version))
    return torchmodel.digests(sorted((n, vllm_worker.shard(n, full[n], rank, tp)) for n in full if n.startswith(("embed", "layers", "norm"))))


@pytest.mark.parametrize("atomic", [False, True])
def test_worker_extension(stand_ins, atomic):
    """Two tensor-parallel workers of one engine, two versions through
    load_weights: each worker's shards equal the slices of the trainer's
    weights, and each reports the version and what it loaded."""
    sender, opts = trainer([1, 2])
    workers = stand_ins(2)
    opened = collective_rpc(workers, "weightcast_open", rendezvous=opts["rendezvous"], run_id=opts["run_id"], world_size=3,
                            first_rank=1, group=opts["group"], transport="tcp", timeout=30.0, bucket=16 << 10)
    assert [o["result"]["rank"] for o in opened] == [1, 2], opened
    for v in (1, 2):
        out = collective_rpc(workers, "weightcast_receive", atomic=atomic)
        for r, o in enumerate(out):
            assert "error" not in o, o
            res = o["result"]
            assert res["version"] == v and res["tensors"] == len(torchmodel.weights(v)) and res["bytes"] > 0
            assert "layers.1.o_proj.weight" in res["loaded"] and "lm_head.weight" not in res["loaded"]
        for r, d in enumerate(collective_rpc(workers, "digests")):
            assert d["result"] == want(v, r, 2), f"worker {r}, version {v}"
    assert all(o["result"] for o in collective_rpc(workers, "weightcast_close"))
    code, events = sender.finish()
    assert code == 0, events


def test_loader_that_stops_early(stand_ins):
    """A load_weights that returns before the round ends is not taken for a
    success: the worker raises, the round is aborted on every rank, nothing
    is committed."""
    sender, opts = trainer([1])
    workers = stand_ins(2, stop_after=3)
    collective_rpc(workers, "weightcast_open", rendezvous=opts["rendezvous"], run_id=opts["run_id"], world_size=3,
                   group=opts["group"], transport="tcp", timeout=30.0, bucket=16 << 10)
    out = collective_rpc(workers, "weightcast_receive")
    assert any("returned before the round ended" in o.get("text", "") for o in out), out
    assert all("error" in o for o in out), out
    code, events = sender.finish()
    assert code == 2 and sender.of("error"), events
    collective_rpc(workers, "weightcast_close")
