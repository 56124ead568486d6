"""Subscribes to a KV event publisher with pyzmq (libzmq's own bindings) and prints each
message's frames in hex, one message per line: the consumer side of the wire test
(tests/e2e/kv_events.rs).

usage: subscribe.py ENDPOINT COUNT
"""

import sys

import zmq


def main() -> int:
    endpoint, count = sys.argv[1], int(sys.argv[2])
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 20_000)
    sub.connect(endpoint)
    print("ready", flush=True)
    for _ in range(count):
        frames = sub.recv_multipart()
        print(" ".join(frame.hex() for frame in frames), flush=True)
    sub.close(linger=0)
    context.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
