"""A weightcast metadata root on libzmq.

usage: pyroot.py WORLD GROUP COUNT

Prints "addr tcp://HOST:PORT", publishes COUNT messages (message k is
b"message k " repeated k % 50 + 1 times) to WORLD-1 receivers within the
window, waits for every acknowledgement, says BYE and prints "done"."""

import sys
import time

import zmq

from wcbus import ACK, BYE, DATA, ERROR, HEARTBEAT, HELLO, WELCOME, WELCOME_BODY, Beat, header, parse, parse_hello

WINDOW = 2
LIVENESS_MS = 3000


def payload(k):
    return (b"message %d " % k) * (k % 50 + 1)


def main():
    world, group, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    ctx = zmq.Context()
    r = ctx.socket(zmq.ROUTER)
    r.setsockopt(zmq.ROUTER_MANDATORY, 1)
    r.setsockopt(zmq.LINGER, 2000)
    port = r.bind_to_random_port("tcp://127.0.0.1")
    print("addr tcp://127.0.0.1:%d" % port, flush=True)

    peers = {}  # identity -> {"acked": n, "beat": Beat, "seen": t}

    def service(timeout_ms):
        now = time.monotonic()
        for ident, p in peers.items():
            if now - p["seen"] > LIVENESS_MS / 1000.0:
                raise SystemExit("receiver %r went silent" % ident)
            if p["beat"].due():
                r.send_multipart([ident, header(HEARTBEAT)])
        if not r.poll(timeout_ms):
            return
        frames = r.recv_multipart()
        ident, (typ, code, seq, body) = frames[0], parse(frames[1:])
        if typ == HELLO:
            rank, w, max_message, hb, live, g = parse_hello(body)
            if g != group or w != world or ident in peers:
                r.send_multipart([ident, header(ERROR, 4 if w != world else 3), b"rejected"])
                raise SystemExit("bad HELLO from %r" % ident)
            peers[ident] = {"acked": 0, "beat": Beat(1.0, live), "seen": time.monotonic()}
            r.send_multipart([ident, header(WELCOME), WELCOME_BODY.pack(WINDOW, 1000, LIVENESS_MS)])
            return
        p = peers[ident]
        p["seen"] = time.monotonic()
        if typ == ACK:
            if seq != p["acked"]:
                raise SystemExit("ACK %d out of order" % seq)
            p["acked"] += 1
        elif typ in (ERROR, BYE):
            raise SystemExit("receiver %r gave up: %r" % (ident, body))

    while len(peers) < world - 1:
        service(50)
    for k in range(count):
        while any(k >= p["acked"] + WINDOW for p in peers.values()):
            service(50)
        for ident in peers:
            r.send_multipart([ident, header(DATA, seq=k), payload(k)])
    while any(p["acked"] < count for p in peers.values()):
        service(50)
    for ident in peers:
        r.send_multipart([ident, header(BYE, seq=count)])
    r.close()
    ctx.term()
    print("done", flush=True)


if __name__ == "__main__":
    main()
