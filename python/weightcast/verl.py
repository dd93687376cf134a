"""weightcast as a verl checkpoint engine: ``WeightcastCheckpointEngine``.

Select it in a verl run (every worker imports ``custom_backend_module``,
which registers the engine as ``"weightcast"`` in verl's
``CheckpointEngineRegistry``)::

    actor_rollout_ref.rollout.checkpoint_engine.backend=weightcast
    ++actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=weightcast.verl
    ++actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.weightcast.transport=auto

It follows verl's ``CheckpointEngine`` contract (verl/checkpoint_engine/base.py):
on every weight update verl calls ``prepare`` on every worker,
``build_topology`` with everybody's metadata, ``init_process_group`` with
each rank's keywords, ``send_weights`` on the trainer and
``receive_weights`` on the rollout concurrently, then ``finalize``. The
group is formed on the first update and kept across updates (its ranks'
two buckets with it); ``rebuild_group=True`` forms a new one each time.

Ranks: trainer rank 0 sends (weightcast rank 0, serving the rendezvous at
an address its ``prepare`` picked); the other trainer ranks get rank -1
and only walk the weights generator, since producing each weight is
collective (FSDP's full_tensor); rollout worker i is weightcast rank i + 1.
Ranks come from ``build_topology`` alone, never from the torchrun variables
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) verl's workers carry for the
trainer's own process group.

A failed update raises ``weightcast.Error`` on the trainer and on every
rollout worker, names the rank that failed, and commits nothing: the
committed version stays the previous one. Tensors the rollout had already
loaded from a failed round's generator are a partial update, which the next
successful update overwrites in full (verl keeps the rollout paused until
then). After a failure the engine forgets the group; the next update's
``prepare`` forms a fresh one.

Without verl installed the class is the same engine, duck-typed.
"""

import asyncio
import socket
import time
import uuid

from ._core import Receiver, Sender, _torch
from .errors import ConfigError, Error

BACKEND = "weightcast"

try:  # verl present: the engine is one of its CheckpointEngines
    from verl.checkpoint_engine.base import CheckpointEngine as _Base
    from verl.checkpoint_engine.base import CheckpointEngineRegistry as _Registry
except ImportError:
    _Base, _Registry = object, None


class WeightcastCheckpointEngine(_Base):
    """verl's checkpoint engine over weightcast.

    ``bucket_size`` (bytes) and ``is_master`` come from verl; the other
    keywords are ``engine_kwargs.weightcast`` of the verl config:
    ``transport`` ("auto", "nccl", "ipc", "tcp"), ``timeout`` (seconds, every
    wait), ``checksum``, ``secret_file`` (the group secret, mode 0600),
    ``tls_ca``/``tls_cert``/``tls_key`` (mutual TLS), ``rollout_dtype`` (what
    the trainer's floating weights are cast to on its GPU before they are
    sent: "bfloat16" as verl's NCCL engine, "float16", "float32", or "keep"),
    ``group`` (the group's name), ``rebuild_group``, ``host`` and ``port``
    (where trainer rank 0 serves the rendezvous: default this node's address
    and a free port), ``advertise`` (the address other hosts reach this rank
    at), ``device`` (default the current CUDA device, or "cpu" without
    one) and ``quantize`` ("fp8-block": the trainer's 2-D linear weights
    travel as block-scaled FP8 codes and ``<name>_scale_inv`` scales, for an
    FP8 rollout; see docs/operations.md, "FP8 rollouts"), and ``bucket_mac``
    ("blake3" or "poly1305-aes": with ``secret_file``, the MAC the trainer
    puts on every bucket; the rollout verifies either).
    """

    def __init__(self, bucket_size, is_master=False, *, transport=None, timeout=None, checksum=None,
                 secret_file=None, tls_ca=None, tls_cert=None, tls_key=None, rollout_dtype="bfloat16",
                 group=None, rebuild_group=False, host=None, port=None, advertise=None, device=None, quantize=None,
                 bucket_mac=None):
        if isinstance(bucket_size, bool) or not isinstance(bucket_size, int) or bucket_size <= 0:
            raise ConfigError(f"WeightcastCheckpointEngine: bucket_size {bucket_size!r} must be a positive number of bytes "
                              "(verl passes checkpoint_engine.update_weights_bucket_megabytes << 20)")
        self.bucket_size = bucket_size
        self.is_master = bool(is_master)
        self.rebuild_group = bool(rebuild_group)
        dtype = None if str(rollout_dtype).replace("torch.", "") in ("keep", "None", "none") else rollout_dtype
        self._options = dict(transport=transport, timeout=timeout, checksum=checksum, secret_file=secret_file,
                             tls_ca=tls_ca, tls_cert=tls_cert, tls_key=tls_key, group=group, advertise=advertise)
        self._dtype = dtype
        self._quantize, self._bucket_mac = quantize, bucket_mac
        self._host, self._port, self._device = host, port, device
        self._member = None   # the Sender or Receiver of the group formed, or an idle Sender (rank -1)
        self._joined = None   # (rank, world_size, run_id) of that group
        self._master = None   # the master's metadata of that group
        self.rank = None
        self.world_size = None
        self.version = 0      # the last version this rank saw committed

    # -- verl's calls, in the order verl makes them ----------------------

    def prepare(self):
        """This rank's metadata for build_topology: on the master, where the
        group meets (a plain dict, so it pickles through Ray); None on the
        other ranks. While the group formed earlier is kept, the master
        returns its metadata again."""
        if not self.is_master:
            return None
        if self._member is not None and self._master is not None:
            return dict(self._master)
        host = self._host or _node_address()
        port = self._port or _free_port(host)
        return {"backend": BACKEND, "rendezvous": f"etcd://{_join_host_port(host, port)}",
                "run_id": uuid.uuid4().hex, "bucket_size": self.bucket_size}

    @classmethod
    def build_topology(cls, trainer_world_size, rollout_world_size, metadata):
        """The keywords of init_process_group for every trainer rank and
        every rollout rank (lists, one entry per rank): trainer rank 0 is
        weightcast rank 0 (it sends), the other trainer ranks -1, rollout
        rank i weightcast rank i + 1. metadata is every worker's prepare(),
        the trainer's first (verl's order)."""
        if trainer_world_size < 1 or rollout_world_size < 1:
            raise ConfigError(f"build_topology: {trainer_world_size} trainer and {rollout_world_size} rollout ranks; "
                              "weightcast needs at least one of each")
        master = metadata[0] if metadata else None
        if not isinstance(master, dict) or master.get("backend") != BACKEND:
            raise ConfigError(f"build_topology: metadata[0] is {master!r}, not the master's prepare(): make trainer rank 0's "
                              "engine with is_master=True and list the trainer's metadata first")
        world = rollout_world_size + 1
        trainer = {"rank": [0] + [-1] * (trainer_world_size - 1), "world_size": [world] * trainer_world_size,
                   "master_metadata": [master] * trainer_world_size}
        rollout = {"rank": list(range(1, rollout_world_size + 1)), "world_size": [world] * rollout_world_size,
                   "master_metadata": [master] * rollout_world_size}
        return trainer, rollout

    def init_process_group(self, rank, world_size, master_metadata):
        """Join the group build_topology placed this rank in; returns once
        every rank has joined (verl calls it on every worker at once). The
        group formed by an earlier update is kept when the rank, world size
        and run are the same."""
        run_id = master_metadata["run_id"] if isinstance(master_metadata, dict) else None
        joined = (rank, world_size, run_id)
        if self._member is not None and self._joined == joined and not self.rebuild_group:
            return
        self._drop()
        if master_metadata is None or run_id is None:
            raise ConfigError(f"init_process_group: master_metadata {master_metadata!r} is not the master's prepare()")
        if master_metadata.get("bucket_size", self.bucket_size) != self.bucket_size:
            raise ConfigError(f"init_process_group: this rank's bucket_size is {self.bucket_size} bytes but the sender's is "
                              f"{master_metadata['bucket_size']}: give every worker the same update_weights_bucket_megabytes")
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            self._member = Sender(rank=-1, world_size=world_size)
        else:
            common = dict(self._options, rank=rank, world_size=world_size, rendezvous=master_metadata["rendezvous"],
                          run_id=run_id, bucket=self.bucket_size, device=self._device or _default_device())
            if rank == 0:
                self._member = Sender(serve_rendezvous=True, dtype=self._dtype, quantize=self._quantize,
                                      bucket_mac=self._bucket_mac, **common)
            else:
                self._member = Receiver(**common)
        self._joined, self._master = joined, dict(master_metadata)

    async def send_weights(self, weights, global_steps=None):
        """Send one update: every (name, tensor) of weights, as model
        version global_steps (or, when that is None or not above the last
        committed version, the next version). Returns once every rollout
        rank has committed it, with metrics: version, bytes, tensors,
        seconds, gb_per_s. Trainer ranks other than 0 only walk weights."""
        member = self._need(Sender, "send_weights")
        if self.rank < 0:
            for _ in weights:
                pass
            return {}
        version = global_steps if global_steps is not None and global_steps > self.version else self.version + 1
        torch = _torch()
        stream = torch.cuda.current_stream() if torch is not None and torch.cuda.is_available() else None

        def send():
            # The weights generator runs on this worker thread: give it the
            # caller's stream, so its tensors are ordered as they were.
            if stream is None:
                return member.send(weights, version)
            with torch.cuda.stream(stream):
                return member.send(weights, version)

        start = time.perf_counter()
        try:
            st = await asyncio.get_running_loop().run_in_executor(None, send)
        except BaseException:
            self._drop()
            raise
        seconds = time.perf_counter() - start
        self.version = version
        nbytes = st["bytes"] if st else 0
        return {"version": version, "bytes": nbytes, "tensors": st["tensors"] if st else 0, "seconds": seconds,
                "gb_per_s": nbytes / seconds / 1e9 if seconds > 0 else 0.0}

    async def receive_weights(self, global_steps=None):
        """Receive one update: an async generator of (name, tensor) views
        into the received bucket (valid until the generator moves past the
        bucket; torch CUDA tensors when the buckets are on a GPU). After the
        last one, every rollout rank has committed the version."""
        member = self._need(Receiver, "receive_weights")
        try:
            async for item in member.areceive():
                yield item
        except BaseException:
            self._drop()
            raise
        self.version = member.version

    def finalize(self):
        """End of one update: keeps the group for the next unless
        rebuild_group was set."""
        if self.rebuild_group:
            self._drop()

    # -- beyond verl's contract --------------------------------------------

    def close(self):
        """Leave the group and release everything (idempotent)."""
        self._drop()

    def _need(self, kind, call):
        if self._member is None:
            raise ConfigError(f"{call}: this engine is in no group; verl calls prepare, build_topology and init_process_group first"
                              " (after a failed update, the next update forms a new group)")
        if not isinstance(self._member, kind):
            role = "rollout ranks" if kind is Receiver else "trainer ranks"
            raise ConfigError(f"{call}: this engine is rank {self.rank}; only {role} call {call}")
        return self._member

    def _drop(self):
        m, self._member, self._joined, self._master = self._member, None, None, None
        if m is not None:
            try:
                m.close()
            except Error:
                pass  # the failure in flight, or the one already raised, says why


def _default_device():
    torch = _torch()
    if torch is not None and torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def _node_address():
    """This node's address as Ray reports it, else the one its hostname
    resolves to (never loopback when another exists)."""
    try:
        import ray
        if ray.is_initialized():
            return ray.util.get_node_ip_address().strip("[]")
    except ImportError:
        pass
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        addr = "127.0.0.1"
    return addr


def _free_port(host):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _join_host_port(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


if _Registry is not None:
    _Registry.register(BACKEND)(WeightcastCheckpointEngine)
