"""What every client (Admin, Publisher, Subscriber, GroupMember) shares: the ZooKeeper client it
uses (its own, started here and stopped on close, unless the caller gave one), `close()` that
runs once, and use as a context manager (`with Publisher(...) as pub:` closes on the way out).

A constructor that fails after `_use_zk` calls `_release_zk()`, so a client started for an object
that never existed does not keep its session (and its ephemeral nodes) alive.
"""

from __future__ import annotations

from typing import Self

from kazoo.client import KazooClient

from roq.config import Config
from roq.zk import start_client, stop_client


class ClientLifecycle:
    zk: KazooClient
    _own_zk: bool = False
    _shut: bool = False  # close() ran (or is running): a second call does nothing

    def _use_zk(self, config: Config, zk: KazooClient | None, refused_for: float | None = None) -> KazooClient:
        """Use `zk`, or start a client of our own (stopped by close())."""
        self._own_zk = zk is None
        self.zk = zk or start_client(config, refused_for=refused_for)
        return self.zk

    def _release_zk(self) -> None:
        """Stop the ZooKeeper client if it is ours (the caller's stays as it is)."""
        if self._own_zk:
            self._own_zk = False
            stop_client(self.zk)

    def _shut_down(self) -> None:
        """Stop what the client runs (its I/O thread, sockets, watches): once, before the ZooKeeper
        client is released."""

    def close(self) -> None:
        if self._shut:
            return
        self._shut = True
        try:
            self._shut_down()
        finally:
            self._release_zk()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
