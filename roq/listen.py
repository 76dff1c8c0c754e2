"""The daemons' listening ZeroMQ sockets (GCM control API, exchange endpoints, replica): an accept
queue sized for a crowd that reconnects at once.

libzmq listens with a backlog of 100. When thousands of clients move together (a GCM or an
exchange died and they all connect to the survivor), connections past the queue have their SYN
dropped and TCP tries again after 1, 2, 4, 8 and 16 s: 4,800 clients moving to a surviving GCM
waited up to 31 s for their first answer (scripts/idle_clients.py --failover). The kernel caps the
value at net.core.somaxconn (4,096 on current kernels).
"""

from __future__ import annotations

import zmq

LISTEN_BACKLOG = 4096


def listening(sock: zmq.Socket) -> zmq.Socket:
    """`sock`, set to queue up to LISTEN_BACKLOG connections not yet accepted (before it binds)."""
    sock.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)
    return sock
