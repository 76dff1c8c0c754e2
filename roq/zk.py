"""Kazoo client construction and the small helpers every role shares."""

from __future__ import annotations

import json
import logging
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from roq.config import Config
from roq.errors import ZooKeeperUnavailableError
from roq.paths import Paths
from roq.security import zk_security

log = logging.getLogger(__name__)


def make_client(config: Config) -> KazooClient:
    """A client that retries reads and writes for at most one session timeout, authenticated
    and creating znodes with the cluster's ACL when `zk.auth` is set (roq.security)."""
    auth_data, default_acl = zk_security(config.zk)
    deadline = config.zk.session_timeout
    return KazooClient(
        hosts=config.zk.hosts,
        timeout=config.zk.session_timeout,
        connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
        command_retry=KazooRetry(max_tries=-1, max_delay=1.0, deadline=deadline),
        auth_data=auth_data or None,
        default_acl=default_acl,
    )


def start_client(config: Config, timeout: float | None = None) -> KazooClient:
    """Connect, or raise ZooKeeperUnavailableError with the servers named. Daemons and test tools
    only: no client code path opens a ZooKeeper session (docs/security.md)."""
    client = make_client(config)
    try:
        client.start(timeout=timeout or config.zk.connect_timeout)
    except KazooTimeoutError:
        _discard(client)
        raise ZooKeeperUnavailableError(
            f"cannot reach ZooKeeper at {config.zk.hosts} (is it running? see zk.hosts)"
        ) from None
    return client


def _discard(client: KazooClient) -> None:
    client.stop()
    client.close()


def stop_client(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()


def ensure_base_paths(client: KazooClient, paths: Paths) -> None:
    for path in paths.base_paths():
        client.retry(client.ensure_path, path)


def encode(data: dict[str, Any]) -> bytes:
    return json.dumps(data, sort_keys=True).encode()


def decode(raw: bytes | None) -> dict[str, Any]:
    """Znode data as a dict; an empty or foreign node reads as {}."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        log.warning("ignoring znode data that is not JSON: %r", raw[:80])
        return {}
    return value if isinstance(value, dict) else {}


def read_json(client: KazooClient, path: str) -> dict[str, Any] | None:
    try:
        raw, _ = client.retry(client.get, path)
    except NoNodeError:
        return None
    return decode(raw)


def read_json_within(client: KazooClient, path: str, timeout: float) -> dict[str, Any] | None:
    """`read_json`, giving up with KazooTimeoutError after `timeout`: a read sent as the
    connection drops waits for a reconnection, which without a quorum never comes."""
    try:
        raw, _ = client.get_async(path).get(timeout=timeout)
    except NoNodeError:
        return None
    return decode(raw)


def children(client: KazooClient, path: str) -> list[str]:
    try:
        return sorted(client.retry(client.get_children, path))
    except NoNodeError:
        return []


def create_ephemeral(client: KazooClient, path: str, data: dict[str, Any]) -> None:
    """Idempotent ephemeral registration: our own node existing already is success."""
    try:
        client.retry(client.create, path, encode(data), ephemeral=True, makepath=True)
    except NodeExistsError:
        _, stat = client.retry(client.get, path)
        if stat.ephemeralOwner != client.client_id[0]:
            raise
        client.retry(client.set, path, encode(data))
