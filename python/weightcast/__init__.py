"""weightcast: stream model weights from one rank to many — from PyTorch.

Trainer side (rank 0)::

    import weightcast
    with weightcast.Sender() as sender:          # RANK, WORLD_SIZE, MASTER_ADDR/PORT from torchrun
        for step in range(steps):
            train_step()
            sender.send(model.named_parameters(), version=step + 1)

Rollout side (ranks 1..N)::

    with weightcast.Receiver() as receiver:
        for step in range(steps):
            model.load_weights(receiver.receive())   # views, valid bucket by bucket
            # or: receiver.load_into(dict(model.named_parameters()))

The package is pure Python over ctypes and libweightcast.so (the Go library
built with `make python`); it imports only the standard library, uses numpy
for host arrays and torch only when it is imported by the caller.
"""

from ._core import Receiver, Sender, Shard
from .errors import ChecksumError, ConfigError, Error, PeerGoneError, TimeoutError

__all__ = ["Sender", "Receiver", "Shard", "Error", "ConfigError", "TimeoutError", "PeerGoneError", "ChecksumError"]
__version__ = "0.1.0"
