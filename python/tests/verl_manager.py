"""Drive WeightcastCheckpointEngine as verl's CheckpointEngineManager does,
over worker processes (verl_worker.py): the tests and the GPU benchmark
use it. Arguments that travel through Ray in verl travel pickled here."""

import base64
import json
import os
import pickle
import queue
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from weightcast.verl import WeightcastCheckpointEngine  # noqa: E402


class Worker:
    """One worker process (verl_worker.py): calls in on stdin, replies out."""

    def __init__(self, name, spec, env):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "verl_worker.py"), json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.lines = queue.Queue()
        self.stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def call(self, call, **kw):
        self.proc.stdin.write(json.dumps(dict(kw, call=call)) + "\n")
        self.proc.stdin.flush()

    def reply(self, call, timeout=90):
        """The reply to call (a dict with "error" when it raised)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"{self.name}: no reply to {call} within {timeout} s; stderr: {''.join(self.stderr)[-2000:]}")
            if msg is None:
                raise AssertionError(f"{self.name} exited ({self.proc.poll()}) before replying to {call}; stderr: {''.join(self.stderr)[-2000:]}")
            if msg["call"] == call:
                return msg

    def ok(self, call, timeout=90):
        msg = self.reply(call, timeout)
        assert "error" not in msg, f"{self.name}: {call} raised {msg['error']}: {msg['text']}"
        return msg


class Manager:
    """What verl's CheckpointEngineManager does on each update_weights,
    over worker processes."""

    def __init__(self, trainers, rollouts):
        self.trainers, self.rollouts = trainers, rollouts

    def form(self):
        workers = self.trainers + self.rollouts
        for w in workers:
            w.call("prepare")
        metadata = [pickle.loads(base64.b64decode(w.ok("prepare")["result"])) for w in workers]
        tkw, rkw = WeightcastCheckpointEngine.build_topology(len(self.trainers), len(self.rollouts), metadata)
        for group, kwargs in ((self.trainers, tkw), (self.rollouts, rkw)):
            for i, w in enumerate(group):
                w.call("init_process_group", kwargs=base64.b64encode(pickle.dumps({k: v[i] for k, v in kwargs.items()})).decode())
        for w in workers:
            w.ok("init_process_group")
        return metadata[0]

    def transfer(self, step, seed, slow=0.0):
        for w in self.trainers:
            w.call("send_weights", step=step, seed=seed)
        for w in self.rollouts:
            w.call("receive_weights", step=step, slow=slow)

    def finalize(self):
        live = [w for w in self.trainers + self.rollouts if w.proc.poll() is None]
        for w in live:
            w.call("finalize")
        for w in live:
            w.ok("finalize")
