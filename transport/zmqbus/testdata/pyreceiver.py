"""A weightcast metadata receiver on libzmq.

usage: pyreceiver.py ADDR RANK WORLD GROUP

Prints "data SEQ LEN SHA256" per message, then "bye" when the root closes,
or "error CODE REASON" when it is rejected or the root gives up."""

import hashlib
import os
import sys
import time

import zmq

from wcbus import ACK, BYE, DATA, ERROR, HEARTBEAT, HELLO, WELCOME, WELCOME_BODY, Beat, header, hello, parse

LIVENESS_S = 3.0


def main():
    addr, rank, world, group = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.ROUTING_ID, ("r%d.py%x" % (rank, os.getpid())).encode())
    s.setsockopt(zmq.LINGER, 2000)
    s.connect(addr)
    s.send_multipart([header(HELLO), hello(rank, world, group, liveness_ms=int(LIVENESS_S * 1000))])

    beat, expected, acked, window = None, 0, 0, 0
    last_seen = time.monotonic()
    deadline = time.monotonic() + 20
    code = 0
    while True:
        now = time.monotonic()
        if beat is None and now > deadline:
            print("error 0 no WELCOME", flush=True)
            code = 5
            break
        if beat is not None and now - last_seen > LIVENESS_S:
            print("error 0 the root went silent", flush=True)
            code = 4
            break
        if beat is not None and beat.due():
            s.send_multipart([header(HEARTBEAT, seq=acked)])
        if not s.poll(50):
            continue
        typ, ecode, seq, body = parse(s.recv_multipart())
        last_seen = time.monotonic()
        if typ == WELCOME:
            window, hb_ms, live_ms = WELCOME_BODY.unpack(body[: WELCOME_BODY.size])
            beat = Beat(1.0, live_ms)
            print("welcome %d %d %d" % (window, hb_ms, live_ms), flush=True)
        elif typ == DATA:
            if seq != expected or seq >= acked + window:
                s.send_multipart([header(ERROR, 1, expected), b"expected message %d, got %d" % (expected, seq)])
                print("error 1 out of order", flush=True)
                code = 3
                break
            print("data %d %d %s" % (seq, len(body), hashlib.sha256(body).hexdigest()), flush=True)
            expected += 1
            s.send_multipart([header(ACK, seq=seq)])
            acked += 1
        elif typ == HEARTBEAT:
            pass
        elif typ == BYE:
            print("bye", flush=True)
            break
        elif typ == ERROR:
            print("error %d %s" % (ecode, body.decode()), flush=True)
            code = 3
            break
    s.close()
    ctx.term()
    return code


if __name__ == "__main__":
    sys.exit(main())
