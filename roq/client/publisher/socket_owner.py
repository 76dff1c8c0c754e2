"""Who may use a publisher link's socket at a given moment: with `client.caller_send` (a prototype,
issue 34 item 5), an application thread may send a batch itself while the I/O thread sleeps.

Why it is safe. A ZeroMQ socket may be used by one thread at a time, and moving it to another
thread needs a full memory barrier. `SocketOwner.lock` gives both: only its holder uses the
socket, and taking and releasing a lock are such barriers. The I/O thread holds it for the whole
of its turn (connect, hello, sends, replies, moves, close) and lets go only while it sleeps. With
the knob on it then sleeps on the socket's ZMQ_FD, an OS descriptor libzmq signals when the socket
has commands to process: polling that descriptor does not touch the socket, polling the socket
would. An application thread only *tries* the lock; held, the I/O thread is awake and is woken as
before. The socket is set here only while it is open; it is unset under the lock before a move or a
close, so no caller ever sees a closed socket.

ZMQ_FD is edge-triggered: any operation on the socket may consume the signal that a reply arrived.
So whoever used the socket last reads ZMQ_EVENTS before letting go: the I/O thread does not sleep
while a reply waits (`readable`), an application thread wakes the I/O thread's pipe when one does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

import zmq


class SocketOwner:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled  # client.caller_send
        self.lock = threading.Lock()
        self.sock: zmq.Socket | None = None  # open to callers (set by its holder, the I/O thread)
        self.caller_sends = 0  # times an application thread sent (tests check the path is taken)

    def offer(self, sock: zmq.Socket | None) -> None:
        """The I/O thread, holding the lock: callers may use `sock` from now on (None: no socket)."""
        self.sock = sock if self.enabled else None

    @contextmanager
    def released(self) -> Iterator[None]:
        """Let go while the I/O thread sleeps; it has the socket again after."""
        self.lock.release()
        try:
            yield
        finally:
            self.lock.acquire()

    def poll_target(self, sock: zmq.Socket) -> zmq.Socket | int:
        """What the I/O thread's poller watches for replies: the socket itself, or its ZMQ_FD when
        callers may use the socket while the I/O thread sleeps."""
        return int(sock.getsockopt(zmq.FD)) if self.enabled else sock

    def readable(self, sock: zmq.Socket) -> bool:
        """Whether a reply waits unseen (the holder, before letting go: ZMQ_FD may not say so)."""
        return self.enabled and _reply_waits(sock)

    def try_send(self, send: Callable[[zmq.Socket], bool], wake: Callable[[], None]) -> bool:
        """An application thread: `send(sock)` if nobody holds the socket. False when it did not
        send (the I/O thread is awake, or `send` declined): the caller wakes the I/O thread instead."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            sock = self.sock
            if sock is None or not send(sock):
                return False
            self.caller_sends += 1
            if _reply_waits(sock):
                wake()  # our send may have taken the signal of a reply the I/O thread sleeps on
            return True
        finally:
            self.lock.release()


def _reply_waits(sock: zmq.Socket) -> bool:
    """ZMQ_EVENTS: libzmq processes the socket's commands first, so this sees a reply just arrived."""
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)
