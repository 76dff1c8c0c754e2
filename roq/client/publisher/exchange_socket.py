"""The publisher link's socket to one exchange: a DEALER, and a monitor that tells its handshakes.

ZeroMQ reconnects a broken connection underneath, and a broken connection takes the frames in
flight with it: the link says hello again after each handshake but the first (`handshakes()`
says when). A refused handshake (no publish right, an unknown key, too many connections) is
reported too; libzmq keeps retrying.
"""

from __future__ import annotations

import zmq
from zmq.utils.monitor import recv_monitor_message

from roq.config import Config
from roq.security import HANDSHAKE_FAILED, secure_client


class ExchangeSocket:
    def __init__(self, context: zmq.Context, config: Config, endpoint: str) -> None:
        self.endpoint = endpoint
        self.sock = context.socket(zmq.DEALER)
        self.sock.linger = 0
        secure_client(self.sock, config)
        if config.client.socket_buffer_bytes:  # before connect: libzmq applies it to new connections
            self.sock.sndbuf = self.sock.rcvbuf = config.client.socket_buffer_bytes
        self.sock.connect(endpoint)
        self.monitor: zmq.Socket | None = None
        self._polled: zmq.Socket | int = self.sock  # what the poller watches for replies
        self._succeeded = 0  # handshakes of this socket's connections

    def watch(self, poller: zmq.Poller, polled: zmq.Socket | int | None = None) -> None:
        """Poll the socket (or `polled`: its ZMQ_FD), and its handshakes from now on."""
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | HANDSHAKE_FAILED)
        self._polled = self.sock if polled is None else polled
        poller.register(self._polled, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)

    def handshakes(self) -> tuple[bool, bool | None]:
        """Since the last look: (whether a handshake other than the socket's first succeeded,
        whether the latest one was refused: None if there was none)."""
        again, refused = False, None
        while self.monitor is not None:
            try:
                event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            refused = bool(event["event"] & HANDSHAKE_FAILED)
            if not refused:
                self._succeeded += 1
                again = again or self._succeeded > 1
        return again, refused

    def drop(self, poller: zmq.Poller) -> None:
        """Close at once, nothing kept (the link is moving)."""
        poller.unregister(self._polled)
        if self.monitor is not None:
            poller.unregister(self.monitor)
        self.close(linger=0)

    def close(self, linger: int) -> None:
        if self.monitor is not None:
            self.sock.disable_monitor()
            self.monitor.close(linger=0)
        self.sock.close(linger=linger)
