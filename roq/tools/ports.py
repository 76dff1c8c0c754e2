"""A port to configure before the process that binds it starts (a seed GCM's, ZooKeeper's).

A port the kernel hands out for port 0 lies in its ephemeral range, where any process's next bind
to port 0 or outgoing connection may take it before ours binds (CI saw an HCM's metrics endpoint
take a GCM's seed port). Ports below that range are only ever taken by name, so one free now
stays free unless someone else names the same one: they are picked at random among those.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20_000  # below: ports services commonly use
TRIES = 200


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, outside the kernel's ephemeral range when it can be."""
    below = _ephemeral_start()
    for _ in range(TRIES if below > LOWEST else 0):
        port = random.randrange(LOWEST, below)
        if bindable(host, port):
            return port
    with socket.socket() as sock:  # no room below the range (or all taken): the kernel's pick
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def bindable(host: str, port: int) -> bool:
    """`port` free on `host` to a listener as ZeroMQ and ZooKeeper bind one (SO_REUSEADDR: a port
    whose last connections linger in TIME_WAIT is free to them)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except (OSError, OverflowError):
            return False
    return True
