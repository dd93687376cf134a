"""weightcast.verl driven exactly as verl's CheckpointEngineManager drives a
checkpoint engine, with every trainer and rollout worker a real process: on
each update prepare on all, build_topology with everybody's metadata,
init_process_group with each rank's keywords, send_weights and
receive_weights at once, finalize on all."""

import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

import torchmodel  # noqa: E402
from conftest import PYTHON_DIR, free_port  # noqa: E402
from verl_manager import Manager, Worker  # noqa: E402
from weightcast.verl import WeightcastCheckpointEngine  # noqa: E402


@pytest.fixture
def workers():
    """workers(n_trainers, n_rollouts, engine={...}) starts the processes,
    each with the torchrun variables of the trainer's own process group
    (which the engine must not take its group from); all are killed at the
    end."""
    started = []
    bogus_port = free_port()

    def spawn(name, master, trainer_rank, engine, n_trainers):
        env = dict(os.environ, PYTHONPATH=PYTHON_DIR, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(bogus_port),
                   RANK=str(trainer_rank), WORLD_SIZE=str(n_trainers), LOCAL_RANK=str(trainer_rank), TORCHELASTIC_RUN_ID="trainer-pg")
        w = Worker(name, {"master": master, "engine": engine}, env)
        started.append(w)
        return w

    def launch(n_trainers, n_rollouts, engine=None):
        engine = dict({"transport": "tcp", "timeout": 30.0, "host": "127.0.0.1"}, **(engine or {}))
        trainers = [spawn(f"trainer {i}", i == 0, i, engine, n_trainers) for i in range(n_trainers)]
        rollouts = [spawn(f"rollout {i}", False, i, engine, n_trainers) for i in range(n_rollouts)]
        return Manager(trainers, rollouts), spawn, engine

    yield launch
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
        w.proc.wait()


def want(seed, dtype=torch.bfloat16):
    named = torchmodel.weights(seed)
    return torchmodel.digests(torchmodel.cast(named, dtype) if dtype is not None else named), len(named)


@pytest.mark.parametrize("rebuild", [False, True])
def test_updates(workers, rebuild):
    """Two trainer ranks (the master and a rank -1 that only walks the
    generator) and three rollout ranks, three updates: every rollout rank
    holds the trainer's weights cast to bf16 (verl's default rollout dtype),
    version = global_steps; the group is kept across updates unless
    rebuild_group."""
    mgr, _, _ = workers(2, 3, {"rebuild_group": rebuild})
    run_ids = []
    for step in (1, 2, 3):
        run_ids.append(mgr.form()["run_id"])
        mgr.transfer(step, seed=step)
        digests, n = want(step)
        sent = mgr.trainers[0].ok("send_weights")
        assert sent["version"] == step and sent["walked"] == n
        m = sent["metrics"]
        assert m["version"] == step and m["tensors"] == n and m["bytes"] > 0 and m["seconds"] > 0 and m["gb_per_s"] > 0, m
        idle = mgr.trainers[1].ok("send_weights")
        assert idle["walked"] == n and idle["metrics"] == {}, idle
        for w in mgr.rollouts:
            got = w.ok("receive_weights")
            assert got["version"] == step
            assert got["digests"] == digests, f"{w.name}, step {step}: {[k for k in digests if got['digests'].get(k) != digests[k]]}"
        mgr.finalize()
    assert len(set(run_ids)) == (3 if rebuild else 1), run_ids


def test_keep_dtype_and_default_versions(workers):
    """rollout_dtype="keep" sends the trainer's bytes as they are; with
    global_steps None (verl's first sync) or not above the last version, the
    next version is committed."""
    mgr, _, _ = workers(1, 2, {"rollout_dtype": "keep"})
    for step, version in ((None, 1), (0, 2), (5, 5)):
        mgr.form()
        mgr.transfer(step, seed=version)
        digests, _ = want(version, dtype=None)
        assert mgr.trainers[0].ok("send_weights")["version"] == version
        for w in mgr.rollouts:
            got = w.ok("receive_weights")
            assert got["version"] == version and got["digests"] == digests
        mgr.finalize()


def test_trainer_killed_mid_update(workers):
    """kill -9 of the sending trainer mid-update: every rollout rank raises a
    weightcast.Error naming rank 0 within seconds and keeps version 1; a
    new master (a fresh group) then updates everyone to version 3."""
    mgr, spawn, engine = workers(2, 2)
    mgr.form()
    mgr.transfer(1, seed=1)
    for w in mgr.trainers + mgr.rollouts:
        w.ok("send_weights" if w in mgr.trainers else "receive_weights")
    mgr.finalize()

    mgr.form()
    mgr.transfer(2, seed=2, slow=0.05)
    for w in mgr.rollouts:
        assert w.reply("batch")
    mgr.trainers[0].proc.send_signal(signal.SIGKILL)
    start = time.monotonic()
    for w in mgr.rollouts:
        got = w.reply("receive_weights", timeout=60)
        assert "error" in got and "Error" in got["mro"], got
        assert "rank 0" in got["text"], got
        assert time.monotonic() - start < 20, f"{w.name} took {time.monotonic() - start:.1f} s to fail"
    mgr.trainers[1].ok("send_weights")  # rank -1 walked its generator and knows nothing of the group
    mgr.finalize()

    mgr.trainers[0] = spawn("trainer 0 (restarted)", True, 0, engine, 2)
    mgr.form()
    mgr.transfer(3, seed=3)
    digests, _ = want(3)
    assert mgr.trainers[0].ok("send_weights")["version"] == 3
    for w in mgr.rollouts:
        got = w.ok("receive_weights")
        assert got["version"] == 3 and got["digests"] == digests
    mgr.finalize()


def test_bad_topology():
    """build_topology without the master's metadata first says what to do."""
    import weightcast
    with pytest.raises(weightcast.ConfigError, match="is_master=True"):
        WeightcastCheckpointEngine.build_topology(2, 2, [None, None, None, None])
    with pytest.raises(weightcast.ConfigError, match="bucket_size"):
        WeightcastCheckpointEngine(bucket_size="1GiB")
    tkw, rkw = WeightcastCheckpointEngine.build_topology(3, 2, [{"backend": "weightcast", "run_id": "r"}, None, None, None, None])
    assert tkw["rank"] == [0, -1, -1] and rkw["rank"] == [1, 2] and tkw["world_size"] == [3] * 3 and rkw["world_size"] == [3] * 2
    assert all(len(v) == 3 for v in tkw.values()) and all(len(v) == 2 for v in rkw.values())


def test_registers_with_verl(tmp_path, monkeypatch):
    """With verl importable, importing weightcast.verl registers the engine
    as "weightcast" in verl's CheckpointEngineRegistry, as a subclass of
    verl's CheckpointEngine. verl itself is not installed here: a stand-in
    package with verl's registry and base class (its documented API) takes
    its place."""
    pkg = tmp_path / "verl" / "checkpoint_engine"
    pkg.mkdir(parents=True)
    (tmp_path / "verl" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text(
        "from abc import ABC\n"
        "class CheckpointEngine(ABC):\n    pass\n"
        "class CheckpointEngineRegistry:\n"
        "    _registry = {}\n"
        "    def register(backend):\n"
        "        def wrapper(cls):\n"
        "            CheckpointEngineRegistry._registry[backend] = cls\n"
        "            return cls\n"
        "        return wrapper\n"
        "    @classmethod\n"
        "    def new(cls, backend, *args, **kwargs):\n"
        "        return cls._registry[backend](*args, **kwargs)\n")
    code = ("import importlib, sys; sys.path.insert(0, %r); sys.path.insert(0, %r)\n"
            "importlib.import_module('weightcast.verl')\n"
            "from verl.checkpoint_engine.base import CheckpointEngineRegistry as R, CheckpointEngine as B\n"
            "e = R.new('weightcast', is_master=True, bucket_size=1 << 20, transport='tcp')\n"
            "assert isinstance(e, B) and e.is_master and e.bucket_size == 1 << 20, e\n"
            "print('registered', type(e).__module__, type(e).__name__)\n") % (str(tmp_path), PYTHON_DIR)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "registered weightcast.verl WeightcastCheckpointEngine" in out.stdout


def test_fp8_rollout(workers):
    """quantize="fp8-block" in the engine kwargs: the rollout receives the
    trainer's 2-D linear weights as FP8 codes with their _scale_inv scales,
    and the other tensors as they are."""
    mgr, _, _ = workers(1, 1, {"quantize": "fp8-block", "rollout_dtype": "keep"})
    mgr.form()
    mgr.transfer(1, seed=1)
    mgr.trainers[0].ok("send_weights")
    got = mgr.rollouts[0].ok("receive_weights")["digests"]
    fp8 = "float8_e4m3fn" if hasattr(torch, "float8_e4m3fn") else "uint8"  # torch 1.13 has no float8: raw bytes
    assert got["layers.0.q_proj.weight"].endswith(f":{fp8}:[32, 32]"), got["layers.0.q_proj.weight"]
    assert got["layers.0.q_proj.weight_scale_inv"].endswith(":float32:[1, 1]")
    assert got["layers.1.up_proj.weight_scale_inv"].endswith(":float32:[1, 1]")
    want_all, _ = want(1, dtype=None)
    for name in ("embed_tokens.weight", "layers.0.q_proj.bias", "norm.weight", "extra.bf16"):
        assert got[name] == want_all[name], name
    assert "embed_tokens.weight_scale_inv" not in got
    mgr.finalize()


def test_group_secret_poly1305(workers, tmp_path):
    """A group secret with bucket_mac="poly1305-aes" in the engine kwargs:
    every bucket carries a Poly1305-AES MAC that the rollout checks, and
    the rollout holds the trainer's weights."""
    secret = tmp_path / "secret"
    secret.write_text("a group secret for the verl test\n")
    secret.chmod(0o600)
    mgr, _, _ = workers(1, 2, {"secret_file": str(secret), "bucket_mac": "poly1305-aes"})
    mgr.form()
    mgr.transfer(1, seed=4)
    digests, _ = want(4)
    mgr.trainers[0].ok("send_weights")
    for w in mgr.rollouts:
        assert w.ok("receive_weights")["digests"] == digests, w.name
    mgr.finalize()
