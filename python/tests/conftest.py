"""Shared set-up of the weightcast Python tests: ranks as real processes
over tcp, with the rendezvous served by rank 0 (torchrun style)."""

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
sys.path.insert(0, PYTHON_DIR)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    """One rank process: its JSON lines, read as they come."""

    def __init__(self, rank, spec, env):
        self.rank = rank
        argv = [sys.executable, spec["script"]] if spec.get("role") == "readme" else [sys.executable, os.path.join(HERE, "rank.py"), json.dumps(spec)]
        self.proc = subprocess.Popen(argv,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        self.lines = queue.Queue()
        self.events = []
        self.stderr = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self.stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                self.lines.put({"event": "noise", "text": line})
        self.lines.put(None)

    def wait_event(self, name, timeout=60):
        """The next event called name (a dict), or None when the process ended first."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"rank {self.rank}: no {name!r} event within {timeout} s; got {self.events}; stderr: {''.join(self.stderr)[-2000:]}")
            try:
                ev = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if ev is None:
                self.lines.put(None)
                return None
            self.events.append(ev)
            if ev.get("event") == name:
                return ev

    def finish(self, timeout=120):
        """Wait for the process; return (exit code, every event)."""
        self.proc.wait(timeout=timeout)
        while self.wait_event("__end__", timeout=5) is not None:
            pass
        return self.proc.returncode, self.events

    def of(self, name):
        return [e for e in self.events if e.get("event") == name]

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)


@pytest.fixture
def group(request):
    """Launch a group: group(specs) starts one process per spec (rank i gets
    spec i) with torchrun variables; every process is killed at the end."""
    started = []

    def launch(specs, world=None, env_extra=None):
        world = world or len(specs)
        port = free_port()
        run = uuid.uuid4().hex[:12]
        name = "".join(c if c.isalnum() else "-" for c in request.node.name[:40]) + "-" + run
        ranks = []
        for i, spec in enumerate(specs):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(i),
                       WORLD_SIZE=str(world), TORCHELASTIC_RUN_ID=run, PYTHONPATH=PYTHON_DIR)
            env.update(spec.pop("env", {}))
            if env_extra:
                env.update(env_extra)
            spec.setdefault("options", {}).setdefault("group", name)
            spec["options"].setdefault("timeout", 30.0)
            r = Rank(i, spec, env)
            ranks.append(r)
            started.append(r)
        return ranks

    yield launch
    for r in started:
        if r.proc.poll() is None:
            r.proc.kill()
        r.proc.wait()
