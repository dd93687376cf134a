"""weightcast inside vLLM: ``WorkerExtension``, for
``LLM(..., worker_extension_cls="weightcast.vllm.WorkerExtension")``.

vLLM mixes the class into each of its GPU workers; the trainer reaches its
methods with ``collective_rpc``, which runs them on every worker of the
engine and returns their results in worker order::

    llm = LLM(model=path, tensor_parallel_size=2, worker_extension_cls="weightcast.vllm.WorkerExtension")
    llm.collective_rpc("weightcast_open", kwargs=dict(rendezvous="etcd://trainer:29600", run_id=run,
                                                      world_size=3, first_rank=1))
    # trainer: weightcast.Sender(rank=0, world_size=3, rendezvous=..., run_id=run, serve_rendezvous=True)
    for step in ...:
        # the trainer's sender.send(...) runs at the same time
        print(llm.collective_rpc("weightcast_receive"))   # [{"version": step, "loaded": [...], ...}, ...]
    llm.collective_rpc("weightcast_close")

Each worker is one weightcast receiver: rank ``first_rank`` + the worker's
rank in its engine (``self.rank``), so several engines share one group by
giving each its own ``first_rank``. ``weightcast_receive`` hands the round
to ``self.model_runner.model.load_weights``, vLLM's own loader: full tensors
in Hugging Face names, each tensor-parallel worker slicing what it keeps.

On failure both ends raise (the trainer's send and the worker's receive,
naming the rank that failed) and the committed version stays the previous
one. Weights load_weights took before the failure are a partial update,
which the next successful round overwrites in full; ``atomic=True`` keeps
the model untouched instead, by holding a copy of the round on the GPU until
it is committed everywhere and loading it only then (one model's memory).

vLLM is not installed where this package is tested: the tests run the
extension in a stand-in worker that follows vLLM's documented contract (a
``model_runner.model`` whose ``load_weights`` takes an iterable of
(name, tensor) and returns the set of names it loaded).
"""

from ._core import Receiver, _torch
from .errors import ConfigError


class WorkerExtension:
    """Methods vLLM's workers gain through worker_extension_cls; call them
    with ``collective_rpc``."""

    _weightcast = None

    def weightcast_open(self, rendezvous, run_id, world_size, first_rank=1, **options):
        """Join the group as receiver rank first_rank + this worker's rank.
        options are weightcast.Receiver's (group, transport, bucket,
        timeout, checksum, secret_file, tls_*, advertise); the device is
        this worker's GPU. Returns {"rank", "transport", "device"}."""
        if self._weightcast is not None:
            raise ConfigError("weightcast_open: this worker is already in a group; call weightcast_close first")
        rank = first_rank + int(getattr(self, "rank", 0))
        torch = _torch()
        if "device" not in options:
            cuda = torch is not None and torch.cuda.is_available()
            options["device"] = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
        self._weightcast = Receiver(rank=rank, world_size=world_size, rendezvous=rendezvous, run_id=run_id, **options)
        r = self._weightcast
        return {"rank": r.rank, "transport": r.transport, "device": r.device}

    def weightcast_receive(self, atomic=False):
        """Receive one round into the model through its load_weights.
        Returns {"version", "tensors", "bytes", "loaded"} — loaded is what
        load_weights reported (sorted), or None when it returns nothing."""
        r = self._weightcast
        if r is None:
            raise ConfigError("weightcast_receive: this worker is in no group; call weightcast_open first")
        model = self.model_runner.model
        count = [0, 0]

        def counted(items):
            for name, t in items:
                count[0] += 1
                count[1] += t.element_size() * t.numel()
                yield name, t

        if atomic:
            held = [(name, t.clone()) for name, t in counted(r.receive())]
            loaded = model.load_weights(iter(held))
            del held
        else:
            rnd = counted(r.receive())
            loaded = model.load_weights(rnd)
            # The round ends (and commits) only when its generator does: a
            # loader that returned early must not be taken for a success.
            left = next(rnd, None)
            rnd.close()  # aborts the round on every rank when it was left early
            if left is not None:
                raise ConfigError(f"weightcast_receive: load_weights returned before the round ended (at {left[0]!r}, "
                                  f"after {count[0] - 1} tensors); the round was aborted and nothing committed")
        return {"version": r.version, "tensors": count[0], "bytes": count[1],
                "loaded": sorted(loaded) if loaded is not None else None}

    def weightcast_close(self):
        """Leave the group (idempotent)."""
        r, self._weightcast = self._weightcast, None
        if r is not None:
            r.close()
        return True
