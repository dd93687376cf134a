"""The weightcast metadata bus, version 1, written from docs/protocol.md
("Metadata bus (ZeroMQ)") on pyzmq, for interoperability tests."""

import struct
import time

import zmq

HELLO, WELCOME, DATA, ACK, HEARTBEAT, ERROR, BYE = range(1, 8)
HEADER = struct.Struct("<2sBBIQ")  # magic, version, type, code, seq: 16 bytes
HELLO_FIXED = struct.Struct("<IIQIIH")  # rank, world, max_message, heartbeat_ms, liveness_ms, group_len
WELCOME_BODY = struct.Struct("<III")  # window, heartbeat_ms, liveness_ms


def header(typ, code=0, seq=0):
    return HEADER.pack(b"WC", 1, typ, code, seq)


def parse(frames):
    """Returns (type, code, seq, body) of a message without routing identity."""
    magic, version, typ, code, seq = HEADER.unpack(frames[0])
    if magic != b"WC" or version != 1:
        raise ValueError("not a version 1 weightcast header: %r" % frames[0])
    want = 2 if typ in (HELLO, WELCOME, DATA, ERROR) else 1
    if len(frames) != want:
        raise ValueError("type %d with %d frames" % (typ, len(frames)))
    return typ, code, seq, frames[1] if want == 2 else b""


def hello(rank, world, group, max_message=64 << 20, heartbeat_ms=1000, liveness_ms=3000):
    g = group.encode()
    return HELLO_FIXED.pack(rank, world, max_message, heartbeat_ms, liveness_ms, len(g)) + g


def parse_hello(body):
    rank, world, max_message, hb, live, n = HELLO_FIXED.unpack(body[: HELLO_FIXED.size])
    group = body[HELLO_FIXED.size : HELLO_FIXED.size + n].decode()
    return rank, world, max_message, hb, live, group


class Beat:
    """Sends HEARTBEAT at least every min(own heartbeat, peer liveness / 3)."""

    def __init__(self, own_s, peer_liveness_ms):
        self.interval = min(own_s, peer_liveness_ms / 3000.0)
        self.last = time.monotonic()

    def due(self):
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            return True
        return False
