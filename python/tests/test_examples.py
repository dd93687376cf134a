"""python/examples run as a user would run them, with stand-ins where the
frameworks are not installed here (verl, vLLM, transformers)."""

import os
import re
import shlex
import sys

import pytest

torch = pytest.importorskip("torch")

import torchmodel  # noqa: E402
import vllm_worker  # noqa: E402
from conftest import PYTHON_DIR  # noqa: E402
from test_vllm import StandIn  # noqa: E402

EXAMPLES = os.path.join(PYTHON_DIR, "examples")
sys.path.insert(0, EXAMPLES)


def test_verl_overrides():
    """Every override of verl_ppo.sh is one verl reads and weightcast takes:
    the backend's registered name, an importable custom_backend_module, and
    engine kwargs that WeightcastCheckpointEngine accepts as given."""
    import weightcast.verl as wv
    text = open(os.path.join(EXAMPLES, "verl_ppo.sh")).read().replace("\\\n", " ")
    words = shlex.split(text.split("main_ppo", 1)[1])
    prefix = "actor_rollout_ref.rollout.checkpoint_engine."
    over = {}
    for w in words:
        if w == '$@':
            continue
        key, value = w.lstrip("+").split("=", 1)
        assert key.startswith(prefix), key
        over[key[len(prefix):]] = value
    assert over.pop("backend") == wv.BACKEND
    assert over.pop("custom_backend_module") == wv.__name__
    bucket = int(over.pop("update_weights_bucket_megabytes")) << 20
    kwargs = {}
    for key, value in over.items():
        m = re.fullmatch(r"engine_kwargs\.weightcast\.(\w+)", key)
        assert m, key
        kwargs[m.group(1)] = {"true": True, "false": False}.get(value, int(value) if value.isdigit() else value)
    engine = wv.WeightcastCheckpointEngine(bucket_size=bucket, is_master=True, **kwargs)
    assert engine.prepare()["bucket_size"] == bucket


class StandInLLM:
    """vLLM's LLM as the example uses it: collective_rpc over its workers
    (stand-in worker processes, vllm_worker.py)."""

    def __init__(self, tp):
        self.workers = [StandIn({"rank": r, "tp": tp}) for r in range(tp)]

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        assert not args
        for w in self.workers:
            w.send(method, **(kwargs or {}))
        out = [w.result() for w in self.workers]
        errors = [o for o in out if "error" in o]
        if errors:
            raise RuntimeError(errors)
        return [o["result"] for o in out]

    def close(self):
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.kill()
            w.proc.wait()


def test_vllm_example():
    """open_group and update of vllm_rollout.py, with the tiny torch model as
    the trainer and two tensor-parallel stand-in workers: three updates,
    each worker's shards equal to the slices of the trainer's parameters."""
    import vllm_rollout
    llm = StandInLLM(2)
    try:
        model = torchmodel.model(7)
        with vllm_rollout.open_group(llm, 2, transport="tcp", timeout=30.0, bucket=16 << 10, group="vllm-example") as sender:
            for step in (1, 2, 3):
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1.5)
                reports = vllm_rollout.update(llm, sender, model.named_parameters(), version=step)
                assert [r["version"] for r in reports] == [step, step]
                full = dict(model.named_parameters())
                for rank, d in enumerate(llm.collective_rpc("digests")):
                    want = torchmodel.digests(sorted((n, vllm_worker.shard(n, full[n], rank, 2)) for n in full))
                    assert d == want, f"worker {rank}, step {step}"
        llm.collective_rpc("weightcast_close")
    finally:
        llm.close()


def test_readme_snippets():
    """The README's verl lines are the example's, and its vLLM snippet runs
    as written, with the stand-in LLM and the tiny torch model."""
    import functools
    import vllm_rollout
    from test_readme import snippet
    text = open(os.path.join(EXAMPLES, "verl_ppo.sh")).read()
    readme = open(os.path.join(PYTHON_DIR, "..", "README.md")).read()
    verl = re.search(r"### In verl and vLLM.*?```sh\n(.*?)```", readme, re.S).group(1)
    for line in verl.strip().splitlines():
        assert line.strip() in text, line
    made = []

    def LLM(model, tensor_parallel_size, worker_extension_cls):
        import importlib
        mod, cls = worker_extension_cls.rsplit(".", 1)
        assert getattr(importlib.import_module(mod), cls)
        made.append(StandInLLM(tensor_parallel_size))
        return made[-1]

    model = torchmodel.model(3)

    def train(m):
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1.0)

    env = {"LLM": LLM, "path": "model-dir", "steps": 2, "model": model, "train": train, "update": vllm_rollout.update,
           "open_group": functools.partial(vllm_rollout.open_group, transport="tcp", timeout=30.0, bucket=16 << 10, group="vllm-readme")}
    try:
        exec(snippet("vllm"), env)
        full = dict(model.named_parameters())
        for rank, d in enumerate(made[0].collective_rpc("digests")):
            assert d == torchmodel.digests(sorted((n, vllm_worker.shard(n, full[n], rank, 2)) for n in full))
    finally:
        for llm in made:
            llm.close()
