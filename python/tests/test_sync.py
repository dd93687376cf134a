"""weightcast from Python, ranks as real processes over tcp."""

import signal
import time

import pytest

import rank as rankmod

BUCKET = 64 << 10


def expected(seed, version):
    return rankmod.digests(rankmod.model(seed + version, BUCKET))


def test_roundtrip_three_versions(group):
    """Every dtype numpy and safetensors share, sizes from 0 to 3x the
    bucket, 2000 small tensors; two receivers (one through receive(), one
    through load_into()) byte-identical to the sender, three versions."""
    versions = [1, 2, 3]
    ranks = group([
        {"role": "sender", "versions": versions, "bucket": BUCKET},
        {"role": "receiver", "versions": versions, "bucket": BUCKET, "mode": "receive"},
        {"role": "receiver", "versions": versions, "bucket": BUCKET, "mode": "load_into"},
    ])
    results = [r.finish() for r in ranks]
    for r, (code, events) in zip(ranks, results):
        assert code == 0, f"rank {r.rank}: exit {code}, {events}, {''.join(r.stderr)[-3000:]}"
    assert ranks[0].of("opened")[0]["transport"] == "tcp"
    for v in versions:
        want = expected(0, v)
        for r in ranks[1:]:
            got = [e for e in r.of("round") if e["version"] == v][0]
            assert got["committed"] == v and got["state"] == "intact"
            assert got["digests"] == want, f"rank {r.rank}, version {v}: differs"
    assert [e["committed"] for e in ranks[0].of("round")] == versions


def test_sender_killed(group):
    """kill -9 of the sender mid-round: every receiver raises PeerGoneError or
    TimeoutError within 30 s, naming rank 0."""
    ranks = group([
        {"role": "sender", "versions": [1], "bucket": 4096, "small": 0},
        {"role": "receiver", "versions": [1], "bucket": 4096, "small": 0, "slow": 0.05},
        {"role": "receiver", "versions": [1], "bucket": 4096, "small": 0, "slow": 0.05},
    ], env_extra=None)
    for r in ranks[1:]:
        assert r.wait_event("batch") is not None
    ranks[0].kill()
    start = time.monotonic()
    for r in ranks[1:]:
        code, events = r.finish(timeout=60)
        took = time.monotonic() - start
        err = r.of("error")
        assert code == 2 and err, f"rank {r.rank}: exit {code}, {events}"
        assert err[0]["type"] in ("PeerGoneError", "TimeoutError"), err
        assert "rank 0" in err[0]["text"], err
        assert took < 30, f"rank {r.rank} took {took:.1f} s to fail"


def test_receiver_killed(group):
    """kill -9 of a receiver mid-round: the sender's send raises naming it."""
    ranks = group([
        {"role": "sender", "versions": [1], "bucket": 4096, "small": 0},
        {"role": "receiver", "versions": [1], "bucket": 4096, "small": 0, "slow": 0.05},
        {"role": "receiver", "versions": [1], "bucket": 4096, "small": 0, "slow": 0.05},
    ])
    assert ranks[2].wait_event("batch") is not None
    ranks[2].kill()
    code, events = ranks[0].finish(timeout=60)
    err = ranks[0].of("error")
    assert code == 2 and err, events
    assert "rank 2" in err[0]["text"], err
    code, events = ranks[1].finish(timeout=60)
    assert code == 2 and ranks[1].of("error"), events


def test_interrupt_aborts_everywhere(group):
    """Ctrl-C (SIGINT) in a receiver mid-round: it raises KeyboardInterrupt
    after aborting the round, and the others fail with that cause."""
    ranks = group([
        {"role": "sender", "versions": [1], "bucket": 4096, "small": 0},
        {"role": "receiver", "versions": [1], "bucket": 4096, "small": 0, "slow": 0.05},
        {"role": "receiver", "versions": [1], "bucket": 4096, "small": 0, "slow": 0.05},
    ])
    assert ranks[1].wait_event("batch") is not None
    ranks[1].kill(signal.SIGINT)
    code, events = ranks[1].finish(timeout=60)
    assert code == 3 and ranks[1].of("error")[0]["type"] == "KeyboardInterrupt", events
    for r in (ranks[0], ranks[2]):
        code, events = r.finish(timeout=60)
        err = r.of("error")
        # Ctrl-C lands in the library's wait (interrupted) or in the
        # consumer's own code, which leaves the generator. The sender hears
        # the cause on the metadata bus; rank 2, next after rank 1 in the
        # tcp chain, may first see rank 1 hang up, which names it.
        text = err[0]["text"] if err else ""
        cause = "interrupted (Ctrl-C)" in text or "receive() was left" in text
        assert code == 2 and (cause or r.rank == 2 and "rank 1" in text), (r.rank, events)


@pytest.mark.parametrize("bad,where,want", [
    ("duplicate", "sender", "'small.3'"),
    ("strided", "sender", "'t.strided'"),
    ("raise", "sender", "the trainer's generator failed"),
    ("unknown", "receiver", "'small.17'"),
    ("shape", "receiver", "'t.float32.3'"),
])
def test_bad_input(group, bad, where, want):
    """Bad input on one rank: a clear exception there, no hang, and the other
    ranks fail with the cause."""
    want = want.replace("'", '"') if where == "sender" and bad != "raise" else want
    specs = [
        {"role": "sender", "versions": [1], "bucket": BUCKET, "small": 50},
        {"role": "receiver", "versions": [1], "bucket": BUCKET, "small": 50, "mode": "load_into"},
        {"role": "receiver", "versions": [1], "bucket": BUCKET, "small": 50, "mode": "load_into"},
    ]
    culprit = 0 if where == "sender" else 1
    specs[culprit]["bad"] = bad
    ranks = group(specs)
    start = time.monotonic()
    results = [r.finish(timeout=60) for r in ranks]
    assert time.monotonic() - start < 30
    for r, (code, events) in zip(ranks, results):
        err = r.of("error")
        assert code == 2 and err, f"rank {r.rank}: exit {code}, {events}, {''.join(r.stderr)[-2000:]}"
        text = err[0]["text"]
        assert want in text or want.replace('"', "'") in text, f"rank {r.rank} does not name the cause: {text}"
    err = ranks[culprit].of("error")[0]
    if bad in ("strided", "unknown", "shape"):
        assert err["type"] == "ConfigError", err


def test_wrong_world_size(group):
    """A rank started with another world size: every rank fails with the
    mismatch, at once."""
    ranks = group([
        {"role": "sender", "versions": [1], "bucket": BUCKET, "small": 10},
        {"role": "receiver", "versions": [1], "bucket": BUCKET, "small": 10, "env": {"WORLD_SIZE": "3"}},
    ])
    start = time.monotonic()
    for r in ranks:
        code, events = r.finish(timeout=60)
        err = r.of("error")
        assert code == 2 and err, (r.rank, events)
        assert err[0]["type"] == "ConfigError" and "world size" in err[0]["text"], err
    assert time.monotonic() - start < 30


def test_interrupt_while_opening(group):
    """Ctrl-C on rank 0 while it waits for a rank that never starts: rank 0
    raises KeyboardInterrupt at once, and the rank that did start fails
    within seconds saying rank 0 was interrupted (not blaming etcd after
    its timeout)."""
    ranks = group([
        {"role": "sender", "versions": [1], "bucket": BUCKET, "small": 10},
        {"role": "receiver", "versions": [1], "bucket": BUCKET, "small": 10},
    ], world=3)  # rank 2 never starts
    time.sleep(3)  # both are waiting in the join
    ranks[0].kill(signal.SIGINT)
    start = time.monotonic()
    code, events = ranks[0].finish(timeout=30)
    assert code == 3 and ranks[0].of("error")[0]["type"] == "KeyboardInterrupt", (code, events)
    assert time.monotonic() - start < 10, f"rank 0 took {time.monotonic() - start:.1f} s to stop"
    code, events = ranks[1].finish(timeout=30)
    err = ranks[1].of("error")
    assert code == 2 and err and "interrupted (Ctrl-C) while opening" in err[0]["text"], events
    assert time.monotonic() - start < 10, f"rank 1 took {time.monotonic() - start:.1f} s to fail"


def test_stale_version(group):
    """Sending a version that is not above the last committed one raises
    ConfigError (a ValueError) on the sender, saying what to do."""
    ranks = group([
        {"role": "sender", "versions": [1], "bucket": BUCKET, "small": 10, "bad": "stale"},
        {"role": "receiver", "versions": [1], "bucket": BUCKET, "small": 10},
    ])
    code, events = ranks[0].finish(timeout=60)
    err = ranks[0].of("error")
    assert code == 2 and err and err[0]["type"] == "ConfigError", events
    assert "not above the last committed version 1" in err[0]["text"] and "higher version" in err[0]["text"], err
