"""The README's Python snippets, run as a trainer process and two rollout
processes (torchrun variables, tcp), with a stand-in model of numpy arrays."""

import os
import re
import textwrap

import pytest

from conftest import PYTHON_DIR, Rank  # noqa: F401  (Rank: the process helper)

README = os.path.join(PYTHON_DIR, "..", "README.md")

PRELUDE = '''
import numpy as np
steps = 3

class Model:
    """A stand-in for a torch module (trainer) or a rollout engine's model."""
    def __init__(self, seed):
        rng = np.random.default_rng(seed)
        self.params = {f"layers.{i}.weight": rng.standard_normal((64, 33)).astype(np.float32) for i in range(20)}
    def named_parameters(self):
        return iter(self.params.items())
    def load_weights(self, weights):
        for name, w in weights:
            np.copyto(self.params[name], w)

def train(model):
    for p in model.params.values():
        p *= 1.5
'''


# The stand-in model is numpy arrays, the host path: its ranks see no GPU,
# so that on a machine with one they do not take GPU buckets by default
# (where receive() hands out torch CUDA tensors).
HOST_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def snippet(tag):
    text = open(README).read()
    m = re.search(r"<!-- python: " + tag + r" -->\s*```python\n(.*?)```", text, re.S)
    assert m, f"README has no python snippet tagged {tag}"
    return m.group(1)


def script(tmp_path, tag, epilogue):
    path = tmp_path / f"{tag}.py"
    path.write_text(PRELUDE + "\nmodel = Model(%s)\n" % ("1" if tag == "trainer" else "2") + snippet(tag) + textwrap.dedent(epilogue))
    return str(path)


def test_readme_snippets(group, tmp_path):
    check = '''
    import hashlib, json
    print(json.dumps({"event": "done", "digest": hashlib.sha256(b"".join(model.params[k].tobytes() for k in sorted(model.params))).hexdigest()}), flush=True)
    '''
    ranks = group([{"role": "readme", "script": script(tmp_path, "trainer", check)}] +
                  [{"role": "readme", "script": script(tmp_path, "rollout", check)} for _ in range(2)],
                  env_extra=HOST_ONLY)
    digests = []
    for r in ranks:
        ev = r.wait_event("done", timeout=120)
        assert ev is not None, f"rank {r.rank}: {r.events} {''.join(r.stderr)[-2000:]}"
        digests.append(ev["digest"])
        assert r.finish()[0] == 0
    assert digests[0] == digests[1] == digests[2]


@pytest.mark.parametrize("run_id", ["", "none"], ids=["no-run-id", "torchrun-default-none"])
def test_readme_snippets_without_run_id(group, tmp_path, run_id):
    """The snippets with only the variables they name: no TORCHELASTIC_RUN_ID
    (empty) or torchrun's default "none". Rank 0 serves the rendezvous, so
    it names the run there and the rollout ranks read it from it."""
    check = '''
    import json
    print(json.dumps({"event": "done"}), flush=True)
    '''
    ranks = group([{"role": "readme", "script": script(tmp_path, "trainer", check)}] +
                  [{"role": "readme", "script": script(tmp_path, "rollout", check)} for _ in range(2)],
                  env_extra={"TORCHELASTIC_RUN_ID": run_id, **HOST_ONLY})
    for r in ranks:
        ev = r.wait_event("done", timeout=120)
        assert ev is not None, f"rank {r.rank}: {r.events} {''.join(r.stderr)[-2000:]}"
        assert r.finish()[0] == 0
