"""Routed groups from Python (senders=, tp=): trainer ranks holding dim-0
shards of a torch model, rollout ranks taking their tensor-parallel shards,
as real processes over tcp on CPU."""

import json
import os
import subprocess
import sys
import uuid

import pytest

torch = pytest.importorskip("torch")

import routed_worker  # noqa: E402
from conftest import HERE, PYTHON_DIR, free_port  # noqa: E402


def run_group(senders, receivers, tp, versions, modes=None):
    port, run = free_port(), uuid.uuid4().hex[:12]
    world = senders + receivers
    procs = []
    for rank in range(world):
        spec = {"senders": senders, "tp": tp, "versions": versions, "options": {"group": "routed-" + run, "timeout": 30.0, "bucket": "64KiB"}}
        if modes and rank >= senders:
            spec["mode"] = modes[rank - senders]
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                   TORCHELASTIC_RUN_ID=run, PYTHONPATH=PYTHON_DIR)
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "routed_worker.py"), json.dumps(spec)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True))
    out = []
    try:
        for rank, p in enumerate(procs):
            stdout, stderr = p.communicate(timeout=120)
            assert p.returncode == 0, f"rank {rank}: exit {p.returncode}\n{stdout}\n{stderr[-3000:]}"
            out.append([json.loads(line) for line in stdout.splitlines() if line.startswith("{")])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


@pytest.mark.parametrize("senders,tp", [(2, 2), (2, 4), (1, 4)])
def test_routed_tp(senders, tp):
    """Every receiver's shards equal the slices of the full weights vLLM's
    TP slicing gives its rank, after each of two updates; receive_shards and
    load_into both; a TP-4 receiver takes a quarter of the model's bytes but
    for the replicated norms and the k/v heads two ranks share (TP 1 runs
    in the Go tests: cmd/demo's TestRoutedProcesses)."""
    receivers = 4
    modes = ["receive", "load_into"] * 2
    out = run_group(senders, receivers, tp, [1, 2], modes)
    whole = None
    for i, events in enumerate(out[senders:]):
        rounds = [e for e in events if e["event"] == "round"]
        assert [e["version"] for e in rounds] == [1, 2], events
        for e in rounds:
            assert e["equal"], f"receiver {i} ({modes[i]}), version {e['version']}: shards differ from the slices"
            assert e["stats"]["bytes_received"] == e["bytes"], (e["stats"], e["bytes"])
        whole = whole or rounds[0]["bytes"]
    sent = [e["stats"]["bytes_sent"] for events in out[:senders] for e in events if e["event"] == "round" and e["version"] == 2]
    received = sum(e["bytes"] for events in out[senders:] for e in events if e["event"] == "round" and e["version"] == 2)
    assert sum(sent) == received
    model = sum(t.numel() * t.element_size() for t in routed_worker.model(1).values())
    assert model / tp < whole < model / tp * 1.34, (model, whole)


def test_routed_options():
    """tp= without senders= is refused before any rank waits."""
    import weightcast
    with pytest.raises(weightcast.ConfigError, match="senders"):
        weightcast.Receiver(rank=1, world_size=2, tp=(0, 2), rendezvous="etcd://127.0.0.1:1", run_id="x")
