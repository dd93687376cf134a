"""One rank of a test group, run as its own process by the tests.

    python3 rank.py '<json spec>'

The spec says what this rank does ("role"), the options to open it with,
and the model (seed, bucket). Progress and results are JSON lines on stdout:
{"event": "opened"}, {"event": "batch", "version": v}, {"event": "round",
"version": v, "digests": {...}}, {"event": "error", "type": ..., "text": ...}.
The torchrun variables come from the environment the test gives.
"""

import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

import weightcast  # noqa: E402

DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"]


def model(seed, bucket, small=2000):
    """The test model of one version: every dtype numpy and safetensors
    share, sizes from 0 to 3x the bucket, and thousands of small tensors."""
    rng = np.random.default_rng(seed)
    out = []
    sizes = [0, 1, 7, bucket // 2, bucket - 64, bucket, bucket + 1, 2 * bucket + 3, 3 * bucket]
    for i, dt in enumerate(DTYPES):
        item = np.dtype(dt).itemsize
        for j, nbytes in enumerate(sizes):
            n = max(nbytes // item, 0)
            raw = rng.integers(0, 256, size=n * item, dtype=np.uint8)
            a = raw.view(dt)
            if dt == "bool":
                a = (raw & 1).astype(np.bool_)
            shape = (n,) if j % 2 else ((n // 4, 4) if n % 4 == 0 and n else (n,))
            out.append((f"t.{dt}.{j}", a.reshape(shape)))
    for k in range(small):
        out.append((f"small.{k}", rng.standard_normal(rng.integers(1, 9)).astype(np.float32)))
    return out


def digests(named):
    return {name: hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).tobytes()).hexdigest() + f":{a.dtype}:{list(a.shape)}" for name, a in named}


def say(**kw):
    print(json.dumps(kw), flush=True)


def main():
    spec = json.loads(sys.argv[1])
    opts = spec.get("options", {})
    # These ranks test the host path (numpy and torch CPU tensors in and
    # out): host buckets, also on a machine with a GPU.
    opts.setdefault("device", "cpu")
    role = spec["role"]
    bucket = spec.get("bucket", 64 << 10)
    versions = spec.get("versions", [1])
    small = spec.get("small", 2000)
    if spec.get("model") == "torch":
        return torch_rank(spec, opts, role, bucket, versions)
    try:
        if role == "sender":
            with weightcast.Sender(bucket=bucket, **opts) as s:
                say(event="opened", transport=s.transport)
                for v in versions:
                    named = model(spec.get("seed", 0) + v, bucket, small)
                    if spec.get("bad") == "duplicate":
                        named.append(("small.3", np.zeros(3, np.float32)))
                    elif spec.get("bad") == "strided":
                        named.insert(5, ("t.strided", np.zeros((8, 8), np.float32)[:, ::2]))
                    elif spec.get("bad") == "raise":
                        def gen(first=named[0]):
                            yield first
                            raise RuntimeError("the trainer's generator failed")
                        named = gen()
                    s.send(named, v)
                    say(event="round", version=v, committed=s.version)
                    if spec.get("bad") == "stale":
                        s.send(named, v)  # the same version again
        else:
            with weightcast.Receiver(bucket=bucket, **opts) as r:
                say(event="opened", transport=r.transport)
                for v in versions:
                    mode = spec.get("mode", "receive")
                    if mode == "load_into":
                        want = model(spec.get("seed", 0) + v, bucket, small)
                        dst = {name: np.zeros_like(a) for name, a in want}
                        if spec.get("bad") == "unknown":
                            del dst["small.17"]
                        elif spec.get("bad") == "shape":
                            dst["t.float32.3"] = np.zeros(5, np.float32)
                        r.load_into(dst)
                        got = list(dst.items())
                    else:
                        got = []
                        slow = spec.get("slow", 0)
                        for name, a in r.receive():
                            if not got:
                                say(event="batch", version=v)
                            if slow:
                                time.sleep(slow)
                            got.append((name, a.copy()))
                    say(event="round", version=v, committed=r.version, state=r.state, digests=digests(got))
    except KeyboardInterrupt:
        say(event="error", type="KeyboardInterrupt", text="interrupted")
        sys.exit(3)
    except Exception as e:  # weightcast.Error, and a generator's own
        say(event="error", type=type(e).__name__, text=str(e))
        sys.exit(2)


def torch_rank(spec, opts, role, bucket, versions):
    """A rank of the torch model (torchmodel.py): torch CPU tensors in and
    out, through receive() or load_into()."""
    import torch  # noqa: F401
    import torchmodel
    try:
        if role == "sender":
            with weightcast.Sender(bucket=bucket, **opts) as s:
                say(event="opened", transport=s.transport)
                for v in versions:
                    st = s.send(torchmodel.weights(v), v)
                    say(event="round", version=v, committed=s.version, stats=st)
        else:
            with weightcast.Receiver(bucket=bucket, **opts) as r:
                say(event="opened", transport=r.transport)
                for v in versions:
                    if spec.get("mode") == "load_into":
                        like = torchmodel.weights(v)
                        if spec.get("cast"):
                            like = torchmodel.cast(like, getattr(torch, spec["cast"]))
                        # a fresh model's own tensors, tied weights included
                        dst = {name: torch.zeros_like(t) for name, t in like}
                        dst["lm_head.weight"] = dst["embed_tokens.weight"]
                        r.load_into(dst)
                        got = list(dst.items())
                    else:
                        got = [(name, t.clone()) for name, t in r.receive()]
                        for name, t in got:
                            if not isinstance(t, torch.Tensor):
                                raise TypeError(f"{name} arrived as {type(t).__name__}, not a torch tensor")
                    say(event="round", version=v, committed=r.version, state=r.state, digests=torchmodel.digests(got),
                        stats=r.last_round)
    except Exception as e:
        say(event="error", type=type(e).__name__, text=str(e))
        sys.exit(2)


if __name__ == "__main__":
    main()
