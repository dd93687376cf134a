"""One verl worker process for the tests: it holds a WeightcastCheckpointEngine
and runs the calls the test — standing in for verl's CheckpointEngineManager —
sends it, one JSON line each on stdin; results go to stdout as JSON lines.
Arguments that travel through Ray in verl (metadata, topology keywords)
travel pickled here, so the test proves they pickle.

    python3 verl_worker.py '<json: {"master": bool, "engine": {...}}>'

Calls: {"call": "prepare"}, {"call": "init_process_group", "kwargs": <b64 pickle>},
{"call": "send_weights", "step": n, "seed": s}, {"call": "receive_weights",
"step": n, "slow": seconds per tensor}, {"call": "finalize"}, {"call": "exit"}.

The spec's "model" says what is sent and where it lands: "tiny" (the
default: torchmodel's CPU tensors; receivers report digests of clones),
"llama" (a transformers Llama on the GPU, random init: the trainer changes
its weights each step, receivers copy into their own model and everyone
reports a digest of its logits) or "bench" (64 bf16 tensors of 128 MiB on
the GPU, copied into the receiver's own; the GPU benchmark's 8 GiB).
"""

import asyncio
import base64
import json
import os
import pickle
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

import torchmodel  # noqa: E402
from weightcast.verl import WeightcastCheckpointEngine  # noqa: E402


def say(**kw):
    print(json.dumps(kw), flush=True)


def pickled(x):
    return base64.b64encode(pickle.dumps(x)).decode()


class Tiny:
    """torchmodel's tensors; receivers keep clones and report digests."""

    def weights(self, seed):
        return torchmodel.weights(seed)

    def start(self):
        self.got = []

    def load(self, name, t):
        self.got.append((name, t.clone()))

    def report(self):
        return {"digests": torchmodel.digests(self.got)}


class Llama:
    """A transformers Llama on the GPU (random init, its own per rank)."""

    def __init__(self, seed):
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                          num_attention_heads=16, num_key_value_heads=4, tie_word_embeddings=False)
        self.model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
        self.params = dict(self.model.named_parameters())
        self.ids = torch.arange(64, device="cuda").remainder(cfg.vocab_size).view(2, 32)

    def weights(self, seed):
        """A training step's stand-in (the same change on every run), then the weights."""
        g = torch.Generator(device="cuda").manual_seed(seed)
        with torch.no_grad():
            for p in self.params.values():
                p.add_(torch.randn(p.shape, generator=g, device="cuda", dtype=torch.float32).to(p.dtype), alpha=1e-3)
        return self.model.named_parameters()

    def start(self):
        pass

    def load(self, name, t):
        with torch.no_grad():
            self.params[name].copy_(t)

    def report(self):
        import hashlib
        with torch.no_grad():
            logits = self.model(self.ids).logits
        torch.cuda.synchronize()
        return {"logits": hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest()}


class Bench:
    """64 bf16 tensors of 128 MiB on the GPU: 8 GiB, as bench_sync.py."""

    def __init__(self, seed, tensors=64, each=128 << 20):
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.params = {f"layers.{i}.weight": torch.randn(each // 2, device="cuda", generator=g, dtype=torch.float32).to(torch.bfloat16)
                       for i in range(tensors)}

    def weights(self, seed):
        torch.cuda.synchronize()
        return self.params.items()

    def start(self):
        pass

    def load(self, name, t):
        self.params[name].copy_(t)

    def report(self):
        torch.cuda.synchronize()
        return {}


def main():
    spec = json.loads(sys.argv[1])
    kind = spec.get("model", "tiny")
    if kind != "tiny":
        torch.cuda.set_device(0)
    data = {"tiny": Tiny, "llama": lambda: Llama(spec.get("seed", 0)), "bench": lambda: Bench(spec.get("seed", 0))}[kind]()
    engine = WeightcastCheckpointEngine(bucket_size=spec.get("bucket", 16 << 10), is_master=spec.get("master", False),
                                        **spec.get("engine", {}))
    for line in sys.stdin:
        cmd = json.loads(line)
        call = cmd["call"]
        try:
            if call == "prepare":
                say(call=call, result=pickled(engine.prepare()))
            elif call == "init_process_group":
                engine.init_process_group(**pickle.loads(base64.b64decode(cmd["kwargs"])))
                say(call=call, rank=engine.rank)
            elif call == "send_weights":
                walked = [0]

                def weights():  # verl's get_per_tensor_param: a generator
                    for item in data.weights(cmd["seed"]):
                        walked[0] += 1
                        yield item

                metrics = asyncio.run(engine.send_weights(weights(), global_steps=cmd.get("step")))
                extra = data.report() if kind == "llama" else {}
                say(call=call, metrics=metrics, walked=walked[0], version=engine.version, **extra)
            elif call == "receive_weights":
                async def consume():  # verl's server adapter: update_weights(generator)
                    data.start()
                    first = True
                    async for name, t in engine.receive_weights(global_steps=cmd.get("step")):
                        if first:
                            say(call="batch")
                            first = False
                        if cmd.get("slow"):
                            time.sleep(cmd["slow"])
                        data.load(name, t)

                start = time.perf_counter()
                asyncio.run(consume())
                seconds = time.perf_counter() - start
                say(call=call, version=engine.version, seconds=seconds, **data.report())
            elif call == "finalize":
                engine.finalize()
                say(call=call)
            elif call == "exit":
                engine.close()
                say(call=call)
                return
        except Exception as e:
            say(call=call, error=type(e).__name__, text=str(e), mro=[c.__name__ for c in type(e).__mro__])


if __name__ == "__main__":
    main()
