"""What every client (Admin, Publisher, Subscriber, GroupMember) shares: the metadata client it
follows topology with (its own, started here and closed on close, unless the caller gave one to
share; roq.client.metadata: the GCMs, never ZooKeeper), `close()` that runs once, and use as a
context manager (`with Publisher(...) as pub:` closes on the way out).

A constructor that fails after `_use_metadata` calls `_release_metadata()`, so a conversation
started for an object that never existed does not go on.
"""

from __future__ import annotations

import logging
from typing import Self

from roq.client.metadata import MetadataClient
from roq.config import Config

log = logging.getLogger(__name__)


class ClientLifecycle:
    metadata: MetadataClient
    _own_metadata: bool = False
    _shut: bool = False  # close() ran (or is running): a second call does nothing

    def _use_metadata(self, config: Config, metadata: MetadataClient | None) -> MetadataClient:
        """Use `metadata`, or start a client of our own (closed by close())."""
        if config.zk.hosts != type(config.zk)().hosts:
            log.debug("zk.hosts is for the servers; this client asks the GCMs of cluster.seeds")
        self._own_metadata = metadata is None
        self.metadata = metadata or MetadataClient(config)
        return self.metadata

    def _release_metadata(self) -> None:
        """Close the metadata client if it is ours (the caller's stays as it is)."""
        if self._own_metadata:
            self._own_metadata = False
            self.metadata.close()

    def _shut_down(self) -> None:
        """Stop what the client runs (its I/O thread, sockets, watches): once, before the metadata
        client is released."""

    def close(self) -> None:
        if self._shut:
            return
        self._shut = True
        try:
            self._shut_down()
        finally:
            self._release_metadata()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
