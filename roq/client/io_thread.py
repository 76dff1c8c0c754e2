"""The base of the clients' I/O threads (a publisher's link, a subscriber's receiver, a group
member's links): each owns its sockets, follows the queue's running exchanges (QueueTopology),
and sleeps in a poll that a wake-up pipe interrupts, written by the topology's watches and by the
application's threads. `close()` stops the thread (at most 5 s), then the watches, then the pipe,
so a late watch never writes into a closed descriptor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from roq.client.metadata import MetadataClient
from roq.client.topology import QueueTopology
from roq.client.wake import WakePipe
from roq.config import Config

JOIN_TIMEOUT = 5.0  # s close() waits for the thread


class QueueIoThread:
    def __init__(self, metadata: MetadataClient, config: Config, queue: str, name: str,
                 on_change: Callable[[], None] | None = None,
                 on_relocations: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Watch the queue; `on_change` (default: wake the thread) runs on watch threads. The thread
        runs `_run` once `_start_thread()` is called."""
        self.config = config
        self.queue = queue
        self._closed = False
        self._wake = WakePipe()
        try:
            self.topology = QueueTopology(metadata, queue, on_change or self._wake.wake, on_relocations)
        except Exception:
            self._wake.close()
            raise
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def _start_thread(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Wake the I/O thread (any thread)."""
        self._wake.wake()

    def on_io_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def close(self) -> None:
        """Stop the I/O thread, then the watches; close the wake-up pipe."""
        self._closed = True
        self._wake.wake()
        self._thread.join(timeout=JOIN_TIMEOUT)
        self.topology.close()
        self._wake.close()
