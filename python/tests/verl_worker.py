"""One verl worker process for the tests: it holds a WeightcastCheckpointEngine
and runs the calls the test — standing in for verl's CheckpointEngineManager —
sends it, one JSON line each on stdin; results go to stdout as JSON lines.
Arguments that travel through Ray in verl (metadata, topology keywords)
travel pickled here, so the test proves they pickle.

    python3 verl_worker.py '<json: {"master": bool, "engine": {...}}>'

Calls: {"call": "prepare"}, {"call": "init_process_group", "kwargs": <b64 pickle>},
{"call": "send_weights", "step": n, "seed": s}, {"call": "receive_weights",
"step": n, "slow": seconds per tensor}, {"call": "finalize"}, {"call": "exit"}.
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


def main():
    spec = json.loads(sys.argv[1])
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
                    for item in torchmodel.weights(cmd["seed"]):
                        walked[0] += 1
                        yield item

                metrics = asyncio.run(engine.send_weights(weights(), global_steps=cmd.get("step")))
                say(call=call, metrics=metrics, walked=walked[0], version=engine.version)
            elif call == "receive_weights":
                async def consume():
                    got = []
                    async for name, t in engine.receive_weights(global_steps=cmd.get("step")):
                        if not got:
                            say(call="batch")
                        if cmd.get("slow"):
                            time.sleep(cmd["slow"])
                        got.append((name, t.clone()))
                    return got

                got = asyncio.run(consume())
                say(call=call, digests=torchmodel.digests(got), version=engine.version)
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
