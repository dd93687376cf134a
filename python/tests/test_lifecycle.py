"""Handles in one process: closing, and many open/send/close cycles."""

import os
import threading
import uuid

import numpy as np
import pytest

import weightcast
from conftest import free_port


def threads():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])


def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10


def fds():
    return len(os.listdir("/proc/self/fd"))


def cycle(monkeypatch, tensors, version=1, sender=None, **extra):
    """Open a sender (on a thread, serving the rendezvous; with the
    keywords sender, too) and a receiver in this process, send one round,
    close both. Returns what was received."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    run = uuid.uuid4().hex[:10]
    # Host buckets, also where a GPU is present: the handles are the test.
    common = dict(world_size=2, run_id=run, group="cycles", bucket=16 << 10, timeout=30.0, device="cpu", **extra)
    errors, got = [], {}

    def send():
        try:
            with weightcast.Sender(rank=0, **common, **(sender or {})) as s:
                s.send(tensors, version)
        except Exception as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=send)
    t.start()
    try:
        with weightcast.Receiver(rank=1, **common) as r:
            for name, a in r.receive():
                got[name] = np.array(a)  # a numpy view, or a torch one once a test imported torch
            assert r.version == version
    finally:
        t.join(60)
    assert not t.is_alive(), "the sender did not finish"
    if errors:
        raise errors[0]
    return got


def test_closed_handle(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    common = dict(world_size=2, run_id=uuid.uuid4().hex[:10], group="closed", bucket=16 << 10, timeout=30.0)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("s", weightcast.Sender(rank=0, **common)))
    t.start()
    r = weightcast.Receiver(rank=1, **common)
    t.join(60)
    s = box["s"]
    r.close()
    r.close()  # idempotent
    s.close()
    with pytest.raises(weightcast.ConfigError, match="closed"):
        s.send([("a", np.zeros(3))], 1)
    with pytest.raises(weightcast.ConfigError, match="closed"):
        next(r.receive())
    with pytest.raises(weightcast.ConfigError, match="closed"):
        r.version


def test_library_handles():
    """The C library itself refuses unknown and closed handles."""
    from weightcast import _lib
    L = _lib.lib()
    for h in (0, 987654321, -5):
        rc = L.wc_close(h)
        assert rc == _lib.OK  # closing what is not open is fine
        assert L.wc_wait(h, 0) == _lib.ERR_CLOSED
        assert "closed" in _lib.last_error()
        assert L.wc_receive(h) == _lib.ERR_CLOSED


def test_many_cycles(monkeypatch):
    """100 open/send/close cycles in one process: threads, file descriptors
    and memory stay bounded."""
    rng = np.random.default_rng(3)
    tensors = [(f"w{i}", rng.standard_normal(rng.integers(1, 3000)).astype(np.float32)) for i in range(40)]
    got = cycle(monkeypatch, tensors)
    assert all(np.array_equal(got[n], a) for n, a in tensors)
    for _ in range(9):
        cycle(monkeypatch, tensors)
    base_threads, base_fds, base_rss = threads(), fds(), rss()
    for i in range(90):
        cycle(monkeypatch, tensors, version=1 + i % 3)
    assert threads() <= base_threads + 8, f"threads grew from {base_threads} to {threads()}"
    assert fds() <= base_fds + 8, f"file descriptors grew from {base_fds} to {fds()}"
    grown = rss() - base_rss
    assert grown < 200 << 20, f"resident memory grew by {grown >> 20} MiB over 90 cycles"


def test_non_sending_trainer_rank():
    """Sender(rank=-1), verl's non-sending trainer rank: joins nothing, and
    send() walks the whole generator (so its collectives would run)."""
    seen = []

    def gen():
        for i in range(5):
            seen.append(i)
            yield f"w{i}", np.zeros(2)

    with weightcast.Sender(rank=-1) as s:
        s.send(gen(), 1)
    assert seen == [0, 1, 2, 3, 4]


def test_import_is_light():
    """import weightcast uses the standard library only: no numpy, no torch,
    and the library is not loaded until a Sender or Receiver is made."""
    import subprocess
    import sys
    code = "import sys, weightcast, weightcast._lib as l; print(sorted(m for m in ('numpy', 'torch') if m in sys.modules), l._lib is None)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(__file__)))).stdout.strip()
    assert out == "[] True", out


@pytest.mark.parametrize("bucket_mac", [None, "poly1305-aes"])
def test_group_secret(monkeypatch, tmp_path, bucket_mac):
    """With a group secret (a file of mode 0600, here through
    WEIGHTCAST_SECRET_FILE) the round goes through, every connection
    proven, every bucket's MAC (keyed BLAKE3, or Poly1305-AES) checked; a
    secret file every user may read is refused as configuration."""
    secret = tmp_path / "secret"
    secret.write_text("a group secret for the test\n")
    secret.chmod(0o600)
    monkeypatch.setenv("WEIGHTCAST_SECRET_FILE", str(secret))
    tensors = [("w", np.arange(100, dtype=np.float32))]
    got = cycle(monkeypatch, tensors, sender=dict(bucket_mac=bucket_mac))
    assert np.array_equal(got["w"], tensors[0][1])
    secret.chmod(0o644)
    with pytest.raises(weightcast.ConfigError, match="secret"):
        weightcast.Receiver(rank=1, world_size=2, run_id="x", rendezvous="etcd://127.0.0.1:1")


@pytest.mark.parametrize("kwargs,field,want", [
    (dict(bucket=100), "bucket", "bucket=100 is below the minimum of 1.0 KiB"),
    (dict(bucket="lots"), "bucket", 'bucket="lots": want a size such as'),
    (dict(timeout=-1), "timeout", "timeout=-1: give a positive number of seconds"),
    (dict(group="a/b"), "group", 'group="a/b": a group name must be'),
    (dict(transport="udp"), "transport", 'transport="udp": choose auto'),
    (dict(bucket_mac="md5"), "bucket_mac", 'bucket_mac="md5": choose "blake3" or "poly1305-aes"'),
])
def test_bad_config_names_keyword(kwargs, field, want):
    """A setting the library refuses raises ConfigError naming the keyword
    as Python spells it (bucket=), before anything is opened."""
    common = dict(rank=0, world_size=2, rendezvous=f"etcd://127.0.0.1:{free_port()}", run_id="r", device="cpu")
    with pytest.raises(weightcast.ConfigError) as e:
        weightcast.Sender(**common, **kwargs)
    assert want in str(e.value) and e.value.field == field, str(e.value)
    assert "bucket " not in str(e.value).replace("bucket size", ""), str(e.value)
