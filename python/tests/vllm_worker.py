"""A stand-in for one vLLM GPU worker process, for the tests (vLLM is not
installed here): it follows vLLM's documented contract — the worker class
gains worker_extension_cls's methods, collective_rpc calls them by name,
``self.model_runner.model.load_weights`` takes an iterable of (name, tensor)
in Hugging Face names and returns the set of names it loaded, and each
tensor-parallel worker slices the full tensors it is handed.

    python3 vllm_worker.py '<json: {"rank": r, "tp": size}>'

Calls on stdin, one JSON line each: {"method": name, "kwargs": {...}}; the
reply is {"method", "result"} or {"method", "error", "text"}; {"method":
"digests"} reports the model's parameters.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

import torchmodel  # noqa: E402
from weightcast.vllm import WorkerExtension  # noqa: E402


def shard(name, full, rank, tp):
    """What tensor-parallel rank `rank` of `tp` keeps of a full tensor, as
    vLLM's Llama loader cuts it: column-parallel projections by rows,
    row-parallel ones by columns, the rest whole."""
    if name.endswith(("q_proj.weight", "q_proj.bias", "up_proj.weight")):
        n = full.shape[0] // tp
        return full.narrow(0, rank * n, n)
    if name.endswith("o_proj.weight"):
        n = full.shape[1] // tp
        return full.narrow(1, rank * n, n)
    return full


class Model(torch.nn.Module):
    """The rollout's model: this rank's shards of torchmodel.Tiny, with
    vLLM's load_weights."""

    def __init__(self, rank, tp, stop_after=None):
        super().__init__()
        self.rank, self.tp, self.stop_after = rank, tp, stop_after
        self.params = {n: torch.nn.Parameter(shard(n, t, rank, tp).clone().zero_(), requires_grad=False)
                       for n, t in torchmodel.model(0).state_dict().items() if n != "lm_head.weight"}

    def load_weights(self, weights):
        loaded = set()
        for i, (name, w) in enumerate(weights):
            if self.stop_after is not None and i == self.stop_after:
                break
            if name == "lm_head.weight":
                continue  # tied to embed_tokens, as vLLM skips it
            if name not in self.params:
                continue  # the extra tensors the test model also sends
            self.params[name].data.copy_(shard(name, w, self.rank, self.tp))
            loaded.add(name)
        return loaded


class Worker(WorkerExtension):
    def __init__(self, rank, tp, stop_after=None):
        self.rank = rank
        self.model_runner = type("ModelRunner", (), {})()
        self.model_runner.model = Model(rank, tp, stop_after)


def main():
    spec = json.loads(sys.argv[1])
    worker = Worker(spec["rank"], spec["tp"], spec.get("stop_after"))
    for line in sys.stdin:
        cmd = json.loads(line)
        method = cmd["method"]
        try:
            if method == "digests":
                result = torchmodel.digests(sorted(worker.model_runner.model.params.items()))
            else:
                result = getattr(worker, method)(**cmd.get("kwargs", {}))
            print(json.dumps({"method": method, "result": result}), flush=True)
        except Exception as e:
            print(json.dumps({"method": method, "error": type(e).__name__, "text": str(e)}), flush=True)
        if method == "weightcast_close":
            return


if __name__ == "__main__":
    main()
