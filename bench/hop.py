#!/usr/bin/env python3
"""The least a broker written in Python adds: one hop through a Python process.

PULL in, PUB out, one blocking receive and one send per message: no acks, no
numbering, no retention, no validation, no poller. `bench/compare.py` runs it
as the system `python-hop` (raw ZeroMQ publisher → this → raw ZeroMQ
subscriber), so that every run shows, beside RoQ, what one Python forwarding
process costs on the same machine: the floor under the latency of any broker
written in Python, RoQ's included. It only needs pyzmq.

    python bench/hop.py tcp://127.0.0.1:5001 tcp://127.0.0.1:5002   # stop with SIGTERM
"""

import sys

import zmq


def forward(front: str, back: str) -> None:
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.rcvhwm = 0  # no high-water mark on either side: nothing is dropped
    pull.bind(front)
    pub = context.socket(zmq.PUB)
    pub.sndhwm = 0
    pub.bind(back)
    recv, send = pull.recv, pub.send
    while True:
        send(recv())


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: hop.py FRONT_ENDPOINT BACK_ENDPOINT")
    forward(sys.argv[1], sys.argv[2])
