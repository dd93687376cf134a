"""The torch path, on CPU with whatever torch is installed (Debian's 1.13 in
CI, 2.x elsewhere): ranks as real processes over tcp, torch tensors in and
out."""

import pytest

torch = pytest.importorskip("torch")

import torchmodel  # noqa: E402

BUCKET = 16 << 10


def test_torch_roundtrip(group):
    """A module's state_dict (tied weights under two names, parameters that
    require grad), every dtype, empty tensors, scalars and views with a
    storage offset: a receive() rank and a load_into() rank (whose tied
    destinations are one tensor) byte-equal to the sender, two versions."""
    versions = [1, 2]
    ranks = group([
        {"role": "sender", "model": "torch", "versions": versions, "bucket": BUCKET},
        {"role": "receiver", "model": "torch", "versions": versions, "bucket": BUCKET},
        {"role": "receiver", "model": "torch", "versions": versions, "bucket": BUCKET, "mode": "load_into"},
    ])
    results = [r.finish() for r in ranks]
    for r, (code, events) in zip(ranks, results):
        assert code == 0, f"rank {r.rank}: exit {code}, {events}, {''.join(r.stderr)[-3000:]}"
    for v in versions:
        want = torchmodel.digests(torchmodel.weights(v))
        for r in ranks[1:]:
            got = [e for e in r.of("round") if e["version"] == v][0]
            assert got["committed"] == v and got["state"] == "intact"
            assert got["digests"] == want, f"rank {r.rank}, version {v}: {set(k for k in want if got['digests'].get(k) != want[k])} differ"
    stats = [e["stats"] for e in ranks[0].of("round")]
    assert [s["version"] for s in stats] == versions and all(s["bytes"] > 0 and s["tensors"] == len(want) for s in stats)


def test_torch_rollout_dtype(group):
    """dtype="bf16" on the sender: F32/F16 tensors arrive as bf16, equal to
    torch's own conversion, and the bucket bytes shrink accordingly."""
    ranks = group([
        {"role": "sender", "model": "torch", "versions": [1], "bucket": BUCKET, "options": {"dtype": torch.bfloat16.__repr__()}},
        {"role": "receiver", "model": "torch", "versions": [1], "bucket": BUCKET, "mode": "load_into", "cast": "bfloat16"},
    ])
    for r in ranks:
        code, events = r.finish()
        assert code == 0, f"rank {r.rank}: exit {code}, {events}, {''.join(r.stderr)[-3000:]}"
    want = torchmodel.digests(torchmodel.cast(torchmodel.weights(1), torch.bfloat16))
    got = ranks[1].of("round")[0]["digests"]
    assert got == want, {k for k in want if got.get(k) != want[k]}


def test_pairs_required():
    """send() of bare tensors (no names) says what it wants, before any
    rank is contacted."""
    import weightcast
    from weightcast._core import _describe
    with pytest.raises(weightcast.ConfigError, match=r"\(name, tensor\) pair"):
        _describe([torch.zeros(3)])
    with pytest.raises(weightcast.ConfigError, match="name must be a str"):
        _describe([(3, torch.zeros(3))])
    recs, names, dims, keep = _describe({"a": torch.zeros(2, 3), "b": torch.ones(1)})  # a mapping is its items
    assert names == b"ab" and list(dims) == [2, 3, 1]
