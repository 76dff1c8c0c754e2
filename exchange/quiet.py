"""Sockets the forwarding loop polls by their ZMQ_FD instead of as ZeroMQ sockets.

zmq_poll asks every ZeroMQ socket it polls for ZMQ_EVENTS twice per blocking call (before it
sleeps and after), and each ask is a look into the socket's mailbox: two system calls (getpid
and poll). For sockets that are idle nearly always (the replay socket, the groups' monitor) that
was a third of the exchange's system calls per frame. Polled by their ZMQ_FD they cost nothing
until a command reaches their mailbox.

ZMQ_FD is edge-triggered: it signals when commands arrive, and any operation on the socket may
consume the signal. It is safe here because nothing but the socket's own drain touches these
sockets, and after each drain the socket is asked once (ZMQ_EVENTS) whether input is left (a
drain stops at its budget): if so it is drained again on the next turn, which then does not
sleep. When a poll times out, every quiet socket is drained anyway (cheap, and a safety net).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import zmq

_POLLIN = int(zmq.POLLIN)


class QuietSockets:
    def __init__(self) -> None:
        self._drains: dict[int, tuple[zmq.Socket, Callable[[], None]]] = {}  # by ZMQ_FD
        self.pending: set[int] = set()  # drained up to a budget, input left: drain again next turn

    def add(self, sock: zmq.Socket, drain: Callable[[], None], poller: zmq.Poller,
            handlers: dict[Any, Callable[[], None]]) -> None:
        """Poll `sock` by its ZMQ_FD; `handlers[fd]` drains it (its `drain` drains until Again or a budget)."""
        fd = cast(int, sock.getsockopt(zmq.FD))
        self._drains[fd] = (sock, drain)
        handlers[fd] = lambda: self.drain(fd)
        poller.register(fd, zmq.POLLIN)

    def drain(self, fd: int) -> None:
        sock, drain = self._drains[fd]
        self.pending.discard(fd)
        drain()
        if cast(int, sock.getsockopt(zmq.EVENTS)) & _POLLIN:
            self.pending.add(fd)

    def turn(self, polled: list[tuple[Any, int]]) -> None:
        """After the loop served what `polled` named: drain the pending sockets it did not name,
        or all of them when the poll timed out."""
        if not polled:
            for fd in list(self._drains):
                self.drain(fd)
            return
        if self.pending:
            served = {item for item, _ in polled}
            for fd in [fd for fd in self.pending if fd not in served]:
                self.drain(fd)
