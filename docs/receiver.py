#!/usr/bin/env python3
"""A weightcast receiver written from docs/protocol.md alone.

It joins one run as one receiving rank, next to weightcast's own ranks:
the rendezvous in etcd (over etcd's JSON gateway, with urllib), the
metadata bus (a ZeroMQ DEALER, with pyzmq), and the tcp byte transport (a
place in the chain, with sockets; it forwards to the next rank unless it
is the last). It checks every bucket's checksum and every entry, and
writes each version the root commits as OUT/version-<V>.safetensors.

usage: receiver.py --etcd http://HOST:PORT --group G --run-id R
                   --rank N --world-size W --out DIR [--timeout SECONDS]

It prints one line per step ("joined", "committed V TENSORS BYTES",
"end") and exits 0 when the root ends the run, or 1 with "error: ..." on
standard error. It needs pyzmq; numpy makes checksums fast but is not
required. It keeps the protocol's rules but not all its courtesies: it
does not watch the other ranks' liveness keys (the bus and the tcp
connections tell it when a peer dies).
"""

import argparse
import base64
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.request

import zmq

try:
    import numpy as np
except ImportError:  # the checksum falls back to plain Python
    np = None


class Failure(Exception):
    """Ends the rank; the message says why."""


# ---------------------------------------------------------------- etcd

class Etcd:
    """The few etcd v3 calls of "Rendezvous (etcd v3)", over the JSON gateway."""

    def __init__(self, url, deadline):
        self.url = url.rstrip("/")
        self.deadline = deadline
        self.lease = 0
        self.stop = threading.Event()

    def call(self, path, body, timeout=10.0):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")

    @staticmethod
    def b64(s):
        return base64.b64encode(s if isinstance(s, bytes) else s.encode()).decode()

    def grant(self, ttl=10):
        self.lease = self.call("/v3/lease/grant", {"TTL": ttl})["ID"]
        threading.Thread(target=self.keepalive, args=(ttl / 3.0,), daemon=True).start()

    def keepalive(self, every):
        while not self.stop.wait(every):
            try:
                self.call("/v3/lease/keepalive", {"ID": self.lease}, timeout=every)
            except OSError:
                pass  # the next one may get through; the lease outlives one miss

    def revoke(self):
        self.stop.set()
        if self.lease:
            self.call("/v3/lease/revoke", {"ID": self.lease})

    def create(self, key, value, leased):
        """Create if absent: returns (created, existing value)."""
        put = {"key": self.b64(key), "value": self.b64(value)}
        if leased:
            put["lease"] = self.lease
        r = self.call("/v3/kv/txn", {
            "compare": [{"key": self.b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": put}],
            "failure": [{"request_range": {"key": self.b64(key)}}],
        })
        if r.get("succeeded"):
            return True, None
        kvs = r["responses"][0]["response_range"].get("kvs", [])
        return False, base64.b64decode(kvs[0].get("value", "")) if kvs else b""

    def get(self, key):
        """Returns (value or None, mod_revision, header revision)."""
        r = self.call("/v3/kv/range", {"key": self.b64(key)})
        kvs = r.get("kvs", [])
        rev = int(r["header"]["revision"])
        if not kvs:
            return None, 0, rev
        return base64.b64decode(kvs[0].get("value", "")), int(kvs[0]["mod_revision"]), rev

    def list(self, prefix):
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        r = self.call("/v3/kv/range", {"key": self.b64(prefix), "range_end": self.b64(end)})
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")) for kv in r.get("kvs", [])}

    def wait(self, key, abort_key=None):
        """Wait for a key: read it, else watch from the read's revision + 1.
        The watch is renewed every second, when abort_key is checked."""
        while True:
            value, _, rev = self.get(key)
            if value is not None:
                return value
            start = rev + 1
            while True:
                if time.monotonic() > self.deadline:
                    raise Failure("timed out waiting for etcd key %s" % key)
                if abort_key is not None:
                    a, _, _ = self.get(abort_key)
                    if a is not None:
                        raise Failure("the run was aborted: %s" % json.loads(a).get("detail"))
                got, compacted = self.watch_once(key, start, 1.0)
                if compacted:
                    break  # read again
                if got is not None:
                    return got

    def watch_once(self, key, start, seconds):
        """Watches key from revision start for about `seconds`; returns
        (value of the first put, compacted)."""
        body = {"create_request": {"key": self.b64(key), "start_revision": str(start)}}
        req = urllib.request.Request(self.url + "/v3/watch", data=json.dumps(body).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=seconds) as r:
                for line in r:
                    msg = json.loads(line).get("result", {})
                    if int(msg.get("compact_revision", 0)):
                        return None, True
                    for ev in msg.get("events", []):
                        if ev.get("type", "PUT") == "PUT":
                            return base64.b64decode(ev["kv"].get("value", "")), False
        except (socket.timeout, TimeoutError):
            pass
        except urllib.error.URLError as e:
            if not isinstance(e.reason, (socket.timeout, TimeoutError)):
                raise
        return None, False

    def add(self, key):
        """Adds one to a decimal counter and returns the new value."""
        while True:
            value, mod, _ = self.get(key)
            if value is None:
                cmp = {"key": self.b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}
                cur = 0
            else:
                cmp = {"key": self.b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": str(mod)}
                cur = int(value)
            r = self.call("/v3/kv/txn", {"compare": [cmp], "success": [
                {"request_put": {"key": self.b64(key), "value": self.b64(str(cur + 1))}}]})
            if r.get("succeeded"):
                return cur + 1


class Rendezvous:
    """A receiver's part of "Joining", and the exchange of addresses."""

    def __init__(self, etcd, group, run, rank, world):
        self.etcd, self.rank, self.world = etcd, rank, world
        self.run = "/weightcast/%s/%s/" % (group, run)

    def abort(self, kind, detail, ranks):
        rec = {"kind": kind, "by": self.rank, "ranks": ranks, "detail": detail,
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.etcd.create(self.run + "abort", json.dumps(rec), leased=False)
        raise Failure(detail)

    def join(self):
        e, run = self.etcd, self.run
        e.grant(10)
        rec = {"world_size": self.world, "host": socket.gethostname(), "pid": os.getpid()}
        created, existing = e.create(run + "ranks/%d" % self.rank, json.dumps(rec), leased=True)
        if not created:
            self.abort("duplicate-rank", "rank %d is already held by %s" % (self.rank, existing.decode()), [self.rank])
        e.create(run + "seen/%d" % self.rank, "", leased=False)
        root = json.loads(e.wait(run + "root", run + "abort"))
        if root["world_size"] != self.world:
            self.abort("world-size-mismatch", "rank %d was started with world size %d but rank 0 with %d"
                       % (self.rank, self.world, root["world_size"]), [0, self.rank])
        self.barrier("join/", "the join barrier")
        ranks = e.list(run + "ranks/")
        for r in range(self.world):
            v = ranks.get(run + "ranks/%d" % r)
            if v is None:
                raise Failure("rank %d joined and then left before the group formed" % r)
            rec = json.loads(v)
            if not isinstance(rec, dict) or rec.get("world_size") != self.world or not isinstance(rec.get("endpoints", {}), dict):
                raise Failure("rank %d's record is malformed: %r" % (r, v))

    def barrier(self, prefix, what):
        """Rendezvous, "Barrier": prefix is under the run ("join/")."""
        e, p = self.etcd, self.run + prefix
        created, _ = e.create(p + str(self.rank), "", leased=False)
        if not created:
            raise Failure("rank %d reached %s twice" % (self.rank, what))
        if e.add(p + "count") == self.world:
            e.create(p + "done", "", leased=False)
        e.wait(p + "done", self.run + "abort")

    def put(self, key, value):
        created, _ = self.etcd.create(self.run + "data/%d/%s" % (self.rank, key), value, leased=True)
        if not created:
            raise Failure("published %s twice" % key)

    def get(self, rank, key):
        return self.etcd.wait(self.run + "data/%d/%s" % (rank, key))


# ---------------------------------------------------------------- metadata bus

HELLO, WELCOME, DATA, ACK, HEARTBEAT, ERROR, BYE = 1, 2, 3, 4, 5, 6, 7
ABORTED = 9
HEADER = struct.Struct("<2sBBIQ")  # magic, version, type, code, seq
HELLO_BODY = struct.Struct("<IIQIIH")  # rank, world, max_message, heartbeat_ms, liveness_ms, group_len
WELCOME_BODY = struct.Struct("<III")  # window, heartbeat_ms, liveness_ms
MAX_MESSAGE = 64 << 20
HEARTBEAT_S, LIVENESS_S = 1.0, 3.0


class Bus:
    """A receiver's DEALER on the root's ROUTER ("Metadata bus (ZeroMQ)")."""

    def __init__(self, addr, rank, world, group, deadline):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, ("r%d.%s" % (rank, os.urandom(8).hex())).encode())
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE + (64 << 10))
        self.sock.connect(addr)
        self.queue, self.expect, self.acked, self.ended = [], 0, 0, False
        self.last_seen = self.last_sent = time.monotonic()
        self.send(HELLO, 0, HELLO_BODY.pack(rank, world, MAX_MESSAGE, int(HEARTBEAT_S * 1000),
                                            int(LIVENESS_S * 1000), len(group.encode())) + group.encode())
        while True:  # the handshake: WELCOME or ERROR
            if time.monotonic() > deadline:
                raise Failure("no WELCOME from the root at %s" % addr)
            if not self.sock.poll(100):
                continue
            typ, code, _, body = self.read()
            if typ == WELCOME:
                self.window, _, root_live_ms = WELCOME_BODY.unpack(body[:WELCOME_BODY.size])
                self.interval = min(HEARTBEAT_S, root_live_ms / 3000.0)
                return
            if typ == ERROR:
                raise Failure("the root refused this rank (code %d): %s" % (code, body.decode(errors="replace")))
            raise Failure("type %d before WELCOME" % typ)

    def send(self, typ, seq, body=None, code=0):
        frames = [HEADER.pack(b"WC", 1, typ, code, seq)]
        if body is not None:
            frames.append(body)
        self.sock.send_multipart(frames)
        self.last_sent = time.monotonic()

    def read(self):
        frames = self.sock.recv_multipart()
        self.last_seen = time.monotonic()
        if len(frames[0]) != HEADER.size:
            raise Failure("a header frame of %d bytes" % len(frames[0]))
        magic, version, typ, code, seq = HEADER.unpack(frames[0])
        if magic != b"WC" or version != 1:
            raise Failure("a header with magic %r version %d" % (magic, version))
        return typ, code, seq, frames[1] if len(frames) > 1 else b""

    def tick(self):
        """Heartbeats, the root's liveness, and whatever arrived."""
        now = time.monotonic()
        if now - self.last_sent >= self.interval:
            self.send(HEARTBEAT, self.acked)
        while self.sock.poll(0):
            typ, code, seq, body = self.read()
            if typ == DATA:
                if seq != self.expect or seq >= self.acked + self.window or len(body) > MAX_MESSAGE:
                    self.abort("message %d out of order or past the window (expected %d, %d acknowledged)" % (seq, self.expect, self.acked), code=1)
                self.queue.append((seq, body))
                self.expect += 1
            elif typ == ERROR:
                raise Failure("the root gave up (code %d): %s" % (code, body.decode(errors="replace")))
            elif typ == BYE:
                if self.acked != self.expect:
                    raise Failure("the root closed the bus with %d of %d messages acknowledged" % (self.acked, self.expect))
                self.ended = True
            elif typ != HEARTBEAT:
                self.abort("unexpected message type %d" % typ, code=1)
        if not self.ended and time.monotonic() - self.last_seen > LIVENESS_S:
            raise Failure("nothing from the root for %.1f s" % LIVENESS_S)

    def recv(self, deadline):
        """The next DATA message as (seq, payload), or None at the root's BYE."""
        while True:
            self.tick()
            if self.queue:
                return self.queue.pop(0)
            if self.ended:
                return None
            if time.monotonic() > deadline:
                raise Failure("no metadata message %d in time" % self.expect)
            self.sock.poll(50)

    def ack(self, seq):
        if seq != self.acked:
            raise Failure("acknowledging %d out of order" % seq)
        self.send(ACK, seq)
        self.acked += 1

    def abort(self, reason, code=ABORTED):
        self.send(ERROR, self.expect, reason.encode()[:4096], code=code)
        raise Failure(reason)

    def close(self):
        self.sock.close()
        self.ctx.term()


# ---------------------------------------------------------------- tcp byte transport

MAGIC, VERSION = 0x77637470, 2
HELLO_FIXED = struct.Struct(">IHBii32sH")  # magic, version, flags, rank, world, nonce, group length
FRAME = struct.Struct(">IHBBQQQ")  # magic, version, kind, code, seq, a, b
BUCKET, CHUNK, ABORT, TACK, NACK = 1, 2, 3, 4, 5
FLAG_SECRET = 1  # this receiver has no group secret, so it never sets it


class Chain:
    """This rank's place in the tcp chain ("tcp byte transport")."""

    def __init__(self, rdv, rank, world, group, tick, deadline):
        self.rank, self.world, self.group, self.tick, self.deadline = rank, world, group, tick, deadline
        ln = socket.create_server(("127.0.0.1", 0))
        rdv.put("tcp.addr", "127.0.0.1:%d" % ln.getsockname()[1])
        self.up = self.accept(ln)
        ln.close()
        self.down = None
        if rank < world - 1:
            host, port = rdv.get(rank + 1, "tcp.addr").decode().rsplit(":", 1)
            self.down = socket.create_connection((host, int(port)), timeout=10)
            self.handshake(self.down, rank + 1, dialer=True)
        for c in (self.up, self.down):
            if c is not None:
                c.settimeout(0.2)  # reads wake up to keep the bus alive

    def hello(self):
        g = self.group.encode()
        # flags 0: no group secret; a fresh nonce; no extra data
        return HELLO_FIXED.pack(MAGIC, VERSION, 0, self.rank, self.world, os.urandom(32), len(g)) + g + struct.pack(">H", 0)

    def read_hello(self, c):
        """(version, flags, rank, world, group), or None for no peer of this protocol."""
        magic, version = struct.unpack(">IH", read_exact(c, 6))
        if magic != MAGIC:
            return None
        if version != VERSION:
            return version, 0, -1, -1, ""  # another layout: read no further
        flags, rank, world, _nonce, glen = struct.unpack(">Bii32sH", read_exact(c, HELLO_FIXED.size - 6))
        group = read_exact(c, glen).decode()
        (elen,) = struct.unpack(">H", read_exact(c, 2))
        read_exact(c, elen)
        return version, flags, rank, world, group

    def verdict(self, h, want):
        """(status, reason): status 0 accepts, 1 refuses, 2 refuses for the secret."""
        version, flags, rank, world, group = h
        if version != VERSION:
            return 1, "the other end speaks tcp protocol version %d, this one %d" % (version, VERSION)
        if group != self.group:
            return 1, "rank %d belongs to group %r, rank %d to %r" % (rank, group, self.rank, self.group)
        if world != self.world:
            return 1, "rank %d says the group has %d ranks, rank %d says %d" % (rank, world, self.rank, self.world)
        if flags & FLAG_SECRET:
            return 2, "authentication failed: rank %d has a group secret and rank %d has none" % (rank, self.rank)
        if rank != want:
            return 1, "rank %d connected where rank %d was expected" % (rank, want)
        return 0, ""

    @staticmethod
    def encode_verdict(v):
        status, reason = v
        m = reason.encode()[:4096]
        return struct.pack(">BH", status, len(m)) + m

    @staticmethod
    def read_verdict(c):
        """The other end's reason to refuse, or "" when it accepts."""
        status, n = struct.unpack(">BH", read_exact(c, 3))
        msg = read_exact(c, n).decode(errors="replace")
        return (msg or "refused without a reason") if status else ""

    def handshake(self, c, peer, dialer):
        """Handshake (tcp), without a group secret (no proofs); None when the
        connection is no peer of this protocol."""
        if dialer:
            c.sendall(self.hello())
            h = self.read_hello(c)
            if h is None:
                raise Failure("rank %d's address answered with something else" % peer)
            theirs = self.read_verdict(c) if h[0] == VERSION else ""
            if theirs:
                raise Failure("tcp handshake with rank %d refused: %s" % (peer, theirs))
            mine = self.verdict(h, peer)
            c.sendall(self.encode_verdict(mine))
            if mine[0]:
                raise Failure("tcp handshake with rank %d refused: %s" % (peer, mine[1]))
            final = self.read_verdict(c)
            if final:
                raise Failure("tcp handshake with rank %d refused: %s" % (peer, final))
        else:
            h = self.read_hello(c)
            if h is None:
                return None
            mine = self.verdict(h, peer)
            c.sendall(self.hello() + self.encode_verdict(mine))
            if mine[0]:
                raise Failure("tcp handshake with rank %d refused: %s" % (peer, mine[1]))
            theirs = self.read_verdict(c)
            if theirs:
                raise Failure("tcp handshake with rank %d refused: %s" % (peer, theirs))
            c.sendall(self.encode_verdict((0, "")))
        return c

    def accept(self, ln):
        ln.settimeout(max(0.1, self.deadline - time.monotonic()))
        while True:
            c, _ = ln.accept()
            c.settimeout(10)
            try:
                if self.handshake(c, self.rank - 1, dialer=False) is not None:
                    return c
            except (OSError, struct.error, Failure):
                pass  # a stranger, or a handshake refused: wait on for the real predecessor
            c.close()

    def read(self, c, n):
        """n bytes from c, ticking the bus while waiting."""
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            if time.monotonic() > self.deadline:
                raise Failure("tcp: timed out")
            try:
                k = c.recv_into(view[got:])
            except socket.timeout:
                self.tick()
                continue
            if k == 0:
                raise Failure("tcp: the connection closed")
            got += k
        return bytes(buf)

    def frame(self, c):
        magic, version, kind, code, seq, a, b = FRAME.unpack(self.read(c, FRAME.size))
        if magic != MAGIC or version != VERSION:
            raise Failure("tcp: a frame with magic %#x version %d" % (magic, version))
        if kind in (ABORT, NACK):
            msg = self.read(c, b).decode(errors="replace") if b <= 4096 else ""
            raise Failure("tcp: a neighbour gave up (code %d, culprit rank %d): %s" % (code, a - 1, msg))
        return kind, seq, a, b

    def bucket(self, seq, n):
        """Receives bucket seq of n bytes, passing it on; returns its bytes."""
        kind, s, a, c = self.frame(self.up)
        if kind != BUCKET or s != seq or a != n or not 1 <= c <= 1 << 30:
            raise Failure("tcp: expected the header of bucket %d of %d bytes, got kind %d bucket %d of %d bytes" % (seq, n, kind, s, a))
        if self.down:
            self.down.sendall(FRAME.pack(MAGIC, VERSION, BUCKET, 0, seq, n, c))
        data = bytearray(n)
        off = 0
        while off < n:
            length = min(c, n - off)
            kind, s, a, b = self.frame(self.up)
            if kind != CHUNK or s != seq or a != off or b != length:
                raise Failure("tcp: expected the chunk of bucket %d at %d of %d bytes" % (seq, off, length))
            chunk = self.read(self.up, length)
            data[off:off + length] = chunk
            if self.down:
                self.down.sendall(FRAME.pack(MAGIC, VERSION, CHUNK, 0, seq, off, length) + chunk)
            off += length
        if self.down:
            kind, s, _, _ = self.frame(self.down)
            if kind != TACK or s != seq:
                raise Failure("tcp: expected rank %d's ack of bucket %d" % (self.rank + 1, seq))
        self.up.sendall(FRAME.pack(MAGIC, VERSION, TACK, 0, seq, 0, 0))
        return bytes(data)

    def close(self):
        for c in (self.up, self.down):
            if c is not None:
                c.close()


def read_exact(c, n):
    b = b""
    while len(b) < n:
        k = c.recv(n - len(b))
        if not k:
            raise OSError("connection closed")
        b += k
    return b


# ---------------------------------------------------------------- buckets

PHI = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8,
               "F8_E4M3": 1, "F8_E5M2": 1, "F16": 2, "BF16": 2, "F32": 4, "F64": 8}


def fmix64(k):
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    return k ^ (k >> 33)


def checksum(data):
    """The bucket checksum of "Bucket metadata", "The checksum"."""
    n = len(data)
    padded = bytes(data) + b"\0" * (-n % 8)
    if np is not None and n:
        with np.errstate(over="ignore"):
            k = np.frombuffer(padded, dtype="<u8") + np.arange(1, len(padded) // 8 + 1, dtype=np.uint64) * np.uint64(PHI)
            k ^= k >> np.uint64(33)
            k *= np.uint64(0xFF51AFD7ED558CCD)
            k ^= k >> np.uint64(33)
            k *= np.uint64(0xC4CEB9FE1A85EC53)
            k ^= k >> np.uint64(33)
            total = int(k.sum(dtype=np.uint64))
    else:
        total = 0
        for i in range(len(padded) // 8):
            total = (total + fmix64((int.from_bytes(padded[8 * i:8 * i + 8], "little") + (i + 1) * PHI) & M64)) & M64
    return fmix64(total ^ n)


def check_reference_values():
    for data, want in ((b"", 0), (b"weightcast", 0x4249E24502FAF7E6), (bytes(range(20)), 0x38CD3014096D9E16)):
        if checksum(data) != want:
            raise Failure("this client's checksum of %r is %016x, the document says %016x" % (data, checksum(data), want))


def is_commit(obj):
    return isinstance(obj, dict) and set(obj) == {"commit"}


class Round:
    """The tensors of one round, from its buckets in order."""

    def __init__(self):
        self.tensors = {}  # name -> [dtype, shape, bytearray, bytes received]
        self.order = []
        self.version = None

    def take(self, meta, data):
        for e in meta["entries"]:
            name, off, size, chunk, total = e["name"], e["offset"], e["size"], e["chunk"], e["total"]
            width = DTYPE_BYTES.get(e["dtype"])
            count = 1
            for d in e["shape"]:
                count *= d
            if width is None or width * count != total or off < 0 or size < 0 or off + size > meta["length"]:
                raise Failure("bucket %d: entry %r does not fit its dtype, shape or bucket" % (meta["seq"], name))
            t = self.tensors.get(name)
            if t is None:
                if chunk != 0:
                    raise Failure("tensor %r: its first bytes arrive at %d" % (name, chunk))
                t = self.tensors[name] = [e["dtype"], e["shape"], bytearray(total), 0]
                self.order.append(name)
            if chunk != t[3] or chunk + size > total:
                raise Failure("tensor %r: bytes [%d, %d) arrived with %d received" % (name, chunk, chunk + size, t[3]))
            t[2][chunk:chunk + size] = data[off:off + size]
            t[3] += size

    def complete(self):
        for name, t in self.tensors.items():
            if t[3] != len(t[2]):
                raise Failure("round %d ended with tensor %r incomplete" % (self.version, name))

    def write(self, path):
        """A safetensors file of the round's tensors, in arrival order."""
        header, off = {}, 0
        for name in self.order:
            dt, shape, data, _ = self.tensors[name]
            header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
            off += len(data)
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        with open(path + ".tmp", "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h)
            for name in self.order:
                f.write(self.tensors[name][2])
        os.replace(path + ".tmp", path)
        return off


def receive(bus, chain, out, deadline):
    """Rounds until the root ends the run; returns the versions committed."""
    committed = []
    while True:
        rnd, index = Round(), 0
        while True:  # the round's buckets
            msg = bus.recv(deadline)
            if msg is None:
                if index == 0:
                    return committed  # BYE where a round would begin: the end
                raise Failure("the root closed the bus in the middle of a round")
            seq, payload = msg
            meta = json.loads(payload)
            if is_commit(meta):
                raise Failure("a commit message where the metadata of a bucket belongs")
            if meta["seq"] != seq or meta["index"] != index or (rnd.version is not None and meta["version"] != rnd.version):
                raise Failure("bucket metadata out of order: message %d carries bucket %d index %d" % (seq, meta["seq"], meta["index"]))
            rnd.version = meta["version"]
            data = chain.bucket(seq, meta["length"])
            if "checksum" in meta:
                s = meta["checksum"]
                if not 1 <= len(s) <= 16 or int(s, 16) != checksum(data):
                    bus.abort("bucket %d failed its checksum: got %016x, the root sent %s" % (seq, checksum(data), s))
            rnd.take(meta, data)
            bus.ack(seq)
            index += 1
            if meta["is_last"]:
                break
        rnd.complete()
        msg = bus.recv(deadline)
        if msg is None:
            raise Failure("the root closed the bus before committing version %d" % rnd.version)
        seq, payload = msg
        commit = json.loads(payload)
        if not is_commit(commit) or commit["commit"] != rnd.version:
            bus.abort("expected the commit message of version %d, got %.80r" % (rnd.version, payload))
        bus.ack(seq)
        size = rnd.write(os.path.join(out, "version-%d.safetensors" % rnd.version))
        committed.append(rnd.version)
        print("committed %d %d %d" % (rnd.version, len(rnd.order), size), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--etcd", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()
    deadline = time.monotonic() + a.timeout
    check_reference_values()
    os.makedirs(a.out, exist_ok=True)
    etcd = Etcd(a.etcd, deadline)
    bus = chain = None
    try:
        rdv = Rendezvous(etcd, a.group, a.run_id, a.rank, a.world_size)
        rdv.join()
        print("joined", flush=True)
        bus = Bus(rdv.get(0, "meta.addr").decode(), a.rank, a.world_size, a.group, deadline)
        chain = Chain(rdv, a.rank, a.world_size, a.group, bus.tick, deadline)
        rdv.barrier("barrier/open/", "the open barrier")
        receive(bus, chain, a.out, deadline)
        print("end", flush=True)
        return 0
    except (Failure, OSError, ValueError, KeyError, TypeError) as e:
        print("error: rank %d: %s" % (a.rank, e), file=sys.stderr, flush=True)
        return 1
    finally:
        if chain is not None:
            chain.close()
        if bus is not None:
            bus.close()
        etcd.revoke()


if __name__ == "__main__":
    sys.exit(main())
