"""Who may talk to the cluster: CURVE keys on ZeroMQ, digest ACLs on ZooKeeper, connection limits.

Keys are pyzmq certificate files under one directory (`roq keys generate DIR`): the cluster's
keypair, `clients/` and `admins/`. With `security.curve` on, every ZeroMQ server socket is a CURVE
server whose context runs a `Gatekeeper`: a ZAP handler that admits the known keys, tags each
connection `role:name`, at a data socket judges a client key by the queue's permission table, and
re-reads the key directories for an unknown key. With or without CURVE it caps the connections one
peer address holds on a socket (`security.max_connections_per_client`), from the socket's monitor
events. With `zk.auth`, every znode a process creates carries a digest ACL. The whole design:
docs/security.md.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from kazoo.security import ACL, make_digest_acl
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from roq.config import Config, SecurityConfig, ZkConfig, credential_list
from roq.errors import ConfigError
from roq.permissions import SOCKET_RIGHTS, PermissionTable

log = logging.getLogger(__name__)

ADMIN, CLIENT, SERVER = "admin", "client", "server"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP specification (RFC 27)
RELOAD_INTERVAL = 1.0  # an unknown key re-reads the key directories at most this often
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_MONITORED = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED | zmq.EVENT_MONITOR_STOPPED


# ---------------------------------------------------------------- keys


def generate_keys(directory: str | os.PathLike[str], clients: Sequence[str] = (), admins: Sequence[str] = ()
                  ) -> list[Path]:
    """Create the server keypair if missing, and one keypair per new client and admin name.

    Existing certificates are never overwritten (a name that exists is an error, checked before
    anything is written). Returns the files written."""
    from roq.names import check_subscriber_name  # same rules as other user-chosen names

    root = Path(directory)
    wanted = [("clients", check_subscriber_name(n)) for n in clients] + \
             [("admins", check_subscriber_name(n)) for n in admins]
    taken = [f"{kind}/{name}" for kind, name in wanted
             if (root / "clients" / f"{name}.key").exists() or (root / "admins" / f"{name}.key").exists()]
    if taken:
        raise ConfigError(f"certificates already exist for {', '.join(taken)}: pick other names")
    if len({name for _, name in wanted}) != len(wanted):
        raise ConfigError("each client and admin name must be given once")
    written = []
    if not (root / "server.key_secret").exists():
        written += _create(root, "server")
    for kind, name in wanted:
        written += _create(root / kind, name)
    return written


def _create(directory: Path, name: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    # Created 0600 rather than chmod'ed afterwards: never readable by others, not even for a moment.
    previous = os.umask(0o077)
    try:
        public, secret = zmq.auth.create_certificates(str(directory), name)
    finally:
        os.umask(previous)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)  # public halves are meant to be copied around
    return [Path(public), Path(secret)]


@dataclass(frozen=True)
class Keys:
    server_public: bytes
    public: bytes  # this process's own keypair: the server's for daemons
    secret: bytes
    server_secret: bytes | None = None  # only on daemons
    keys_dir: Path = field(default_factory=Path)

    def roles(self) -> dict[bytes, tuple[str, str]]:
        """z85 public key → (role, key name), read from the key directories now."""
        found = {self.server_public: (SERVER, "server")}
        for kind, role in (("clients", CLIENT), ("admins", ADMIN)):
            for cert in self.certificates(kind):
                try:
                    public, _ = zmq.auth.load_certificate(str(cert))
                except (OSError, ValueError) as exc:
                    log.warning("skipping unreadable certificate %s: %s", cert, exc)
                    continue
                found[public] = (role, cert.stem)
        return found

    def certificates(self, kind: str) -> list[Path]:
        """The public certificates under `kind` ("clients" or "admins")."""
        folder = self.keys_dir / kind
        return sorted(folder.glob("*.key")) if folder.is_dir() else []

    def certificate_of(self, name: str) -> str | None:
        """Where key `name`'s certificate is ("clients/app"), None if neither directory has it."""
        for kind in ("admins", "clients"):
            if (self.keys_dir / kind / f"{name}.key").is_file():
                return f"{kind}/{name}"
        return None

    def stamp(self) -> tuple[int, ...]:
        """When the key directories last changed: a new certificate changes this."""
        stamps = []
        for kind in ("clients", "admins"):
            try:
                stamps.append((self.keys_dir / kind).stat().st_mtime_ns)
            except OSError:
                stamps.append(0)
        return tuple(stamps)


@functools.lru_cache(maxsize=8)
def load_keys(security: SecurityConfig) -> Keys | None:
    """This process's keys, or None with CURVE off. A missing or bad file is a ConfigError."""
    if not security.curve:
        return None
    root = Path(security.keys_dir)
    if not root.is_dir():
        raise ConfigError(f"security.keys_dir {root} is not a directory (make one with `roq keys generate`)")
    server_public, server_secret = _load(root / ("server.key_secret" if (root / "server.key_secret").exists()
                                                 else "server.key"))
    if security.identity:
        if ".." in Path(security.identity).parts:
            raise ConfigError("security.identity must name a certificate inside security.keys_dir")
        public, secret = _load(root / f"{security.identity}.key_secret")
        if secret is None:
            raise ConfigError(f"{security.identity}.key_secret holds no secret key")
    elif server_secret is not None:
        public, secret = server_public, server_secret
    else:
        raise ConfigError("security.identity must name this client's certificate (e.g. clients/app): "
                          f"{root} holds no server secret to fall back on")
    return Keys(server_public, public, secret, server_secret, root)


def _load(path: Path) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read certificate {path}: {exc}") from None


def secure_client(sock: zmq.Socket, config: Config) -> None:
    """Make `sock` a CURVE client of the cluster when CURVE is on; call before connect()."""
    keys = load_keys(config.security)
    if keys is not None:
        sock.curve_serverkey = keys.server_public
        sock.curve_publickey = keys.public
        sock.curve_secretkey = keys.secret


def refusal_text(config: Config, endpoint: str, right: str) -> str:
    """What a client says when `endpoint` refused its handshake (the server does not say why)."""
    who = f"key {Path(config.security.identity).name}" if config.security.identity else "the server key"
    return (f"{endpoint} refused the handshake of {who}: the key may lack the {right} right on this queue "
            "(roq keys show NAME), be unknown there, or this address holds too many connections "
            "(security.max_connections_per_client)")


def peer_role(frame: zmq.Frame) -> str | None:
    """The role the gatekeeper gave the connection a frame came from; None if none ran."""
    return peer_identity(frame)[0]


def peer_identity(frame: zmq.Frame) -> tuple[str | None, str]:
    """(role, key name) the gatekeeper gave the connection a frame came from; (None, "") if none ran."""
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:
        return None, ""
    if not user:
        return None, ""
    role, _, name = str(user).partition(":")
    return role, name


# ---------------------------------------------------------------- gatekeeper


@dataclass
class _Watched:
    """The open connections of one server socket: fd → peer address."""
    domain: bytes
    monitor: zmq.Socket
    peers: dict[int, str] = field(default_factory=dict)
    on_disconnect: Callable[[int], None] | None = None  # told each dropped connection's fd (any thread)

    def over(self, address: str, limit: int) -> bool:
        """More than `limit` open connections from `address`, this one included?"""
        if self._count(address) <= limit:
            return False
        # Monitor events are dropped when their queue is full: a missed DISCONNECTED must not
        # lock a client out for good, so check the connections before refusing.
        for fd in [fd for fd, a in self.peers.items() if a == address]:
            if _peer_address(fd) != address:
                del self.peers[fd]
        return self._count(address) > limit

    def _count(self, address: str) -> int:
        return sum(1 for a in self.peers.values() if a == address)


class Gatekeeper:
    """ZAP handler and connection limiter for the server sockets of one ZeroMQ context.

    `guard()` every server socket before binding it, then `start()`. The thread only answers
    ZAP requests and reads monitor events; nothing it does blocks the sockets' own traffic.
    `queue` (an exchange's or replica's) makes its data sockets check the permission table."""

    def __init__(self, context: zmq.Context, config: Config, name: str, queue: str | None = None) -> None:
        self.keys = load_keys(config.security)
        if self.keys is not None and self.keys.server_secret is None:
            raise ConfigError(f"{name} serves CURVE and needs {self.keys.keys_dir}/server.key_secret")
        self.limit = config.security.max_connections_per_client
        self.name = name
        self.queue = queue
        self.refused = 0  # handshakes that failed: unknown key, wrong mechanism, no permission, over the limit
        self.refused_limit = 0  # of which over the connection limit
        self.refused_permission = 0  # of which for a right the key lacks on this queue
        # Replaced whole (never changed in place) from another thread: the ZAP thread reads one table.
        self.permissions: PermissionTable | None = None  # None: not received yet, no client key admitted
        self._permissions_known = threading.Event()
        self._watched: list[_Watched] = []
        self._roles = self.keys.roles() if self.keys else {}
        self._roles_read = time.monotonic()
        self._roles_stamp = self.keys.stamp() if self.keys else ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._zap: zmq.Socket | None = None
        if self.needed:
            # Bound before any server socket binds: handshakes wait for our answer, none slips by.
            self._zap = context.socket(zmq.REP)
            self._zap.linger = 0
            self._zap.bind(ZAP_ENDPOINT)

    @property
    def needed(self) -> bool:
        return self.keys is not None or self.limit > 0

    def guard(self, sock: zmq.Socket, domain: str, on_disconnect: Callable[[int], None] | None = None) -> None:
        """Put a server socket under this gatekeeper; call before bind(). `on_disconnect(fd)` is
        called from the gatekeeper's thread for each connection that drops (a socket has one
        monitor, and this is it)."""
        if not self.needed:
            return
        if self.keys is not None:
            sock.curve_server = True
            sock.curve_publickey = self.keys.server_public
            sock.curve_secretkey = self.keys.server_secret
        # A domain makes libzmq ask us even for unauthenticated (NULL) handshakes.
        sock.zap_domain = domain.encode()
        self._watched.append(_Watched(domain.encode(), sock.get_monitor_socket(_MONITORED),
                                      on_disconnect=on_disconnect))

    def start(self) -> None:
        """Serve ZAP requests and watch connections; every socket must be guarded by now."""
        if not self.needed or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"gatekeeper-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and close its sockets: needed before the context can terminate."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        elif self._zap is not None:
            for sock in [self._zap] + [w.monitor for w in self._watched]:
                sock.close(linger=0)

    def set_permissions(self, table: PermissionTable) -> None:
        """The permission table from now on (any thread): new connections are judged by it."""
        self.permissions = table
        self._permissions_known.set()

    def wait_permissions(self, timeout: float) -> bool:
        """Has a permission table arrived (waiting up to `timeout` seconds for the first)?"""
        return self._permissions_known.wait(timeout)

    @property
    def permissions_version(self) -> int:
        table = self.permissions
        return table.version if table is not None else 0

    def snapshot(self) -> dict[str, int]:
        return {"refused_connections": self.refused, "refused_over_limit": self.refused_limit,
                "refused_permission": self.refused_permission, "permissions_version": self.permissions_version}

    def _run(self) -> None:
        assert self._zap is not None
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        for watched in self._watched:
            poller.register(watched.monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(200))
                # Monitor events first: a connection's ACCEPTED always precedes its ZAP request.
                for watched in self._watched:
                    self._drain_monitor(watched)
                if self._zap in ready:
                    self._answer_zap()
        except zmq.ContextTerminated:
            pass
        finally:
            for sock in [self._zap] + [w.monitor for w in self._watched]:
                sock.close(linger=0)

    def _drain_monitor(self, watched: _Watched) -> None:
        while True:
            try:
                event = recv_monitor_message(watched.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, fd = event["event"], event["value"]
            if kind == zmq.EVENT_ACCEPTED:
                address = _peer_address(fd)
                if address:
                    watched.peers[fd] = address
            elif kind == zmq.EVENT_DISCONNECTED:
                watched.peers.pop(fd, None)
                if watched.on_disconnect is not None:
                    watched.on_disconnect(fd)
            elif kind & HANDSHAKE_FAILED:
                self.refused += 1

    def _answer_zap(self) -> None:
        assert self._zap is not None
        request = self._zap.recv_multipart()
        if len(request) < 6:  # never from libzmq; a REP socket must answer all the same
            self._zap.send_multipart([b"1.0", b"", b"500", b"malformed ZAP request", b"", b""])
            return
        version, request_id, domain, address, _identity, mechanism = request[:6]
        try:
            status, text, user = self._decide(domain, address.decode(errors="replace"), mechanism, request[6:])
        except Exception:  # fail closed, and keep answering: a dead handler would hang every handshake
            log.exception("%s: error while deciding on a connection; refusing it", self.name)
            status, text, user = b"500", b"internal error", b""
        if status != b"200":
            log.info("%s refused a connection from %s: %s", self.name, address.decode(errors="replace"),
                     text.decode())
        self._zap.send_multipart([version, request_id, status, text, user, b""])

    def _decide(self, domain: bytes, address: str, mechanism: bytes,
                credentials: list[bytes]) -> tuple[bytes, bytes, bytes]:
        role, name = "", ""
        if self.keys is not None:
            if mechanism != b"CURVE" or not credentials:
                return b"400", b"CURVE required", b""
            role, name = self._identity_of(z85.encode(credentials[0]))
            if not role:
                return b"400", b"unknown client key", b""
            refusal = self._refusal(domain.decode(errors="replace"), role, name)
            if refusal:
                self.refused_permission += 1
                return b"400", refusal.encode(), b""
        # The count includes this connection and any not yet decided: a burst beyond the limit
        # may be refused as a whole, but more than `limit` connections are never admitted at once.
        watched = next((w for w in self._watched if w.domain == domain), None)
        if self.limit and watched is not None and watched.over(address, self.limit):
            self.refused_limit += 1
            return b"400", f"more than {self.limit} connections from {address}".encode(), b""
        user = f"{role}:{name}" if role else ""
        return b"200", b"OK", user.encode()

    def _refusal(self, domain: str, role: str, name: str) -> str:
        """Why key `name` may not connect to socket `domain` of this process ("" if it may)."""
        if domain == "replication":
            return "" if role == SERVER else "the replication socket is for the cluster's daemons"
        right = SOCKET_RIGHTS.get(domain)
        if right is None or self.queue is None or role in (SERVER, ADMIN):
            return ""
        table = self.permissions
        if table is None:
            return "the permission table has not arrived yet"
        return "" if table.allows(name, right, self.queue) else f"key {name} may not {right} queue {self.queue}"

    def _identity_of(self, key: bytes) -> tuple[str, str]:
        """(role, name) of a z85 public key; ("", "") if it is not known."""
        found = self._roles.get(key)
        if found:
            return found
        assert self.keys is not None
        # A client's first connection may follow `roq keys generate` within the interval: a changed
        # directory is read at once, so clients are not refused for being quick.
        stamp = self.keys.stamp()
        if stamp != self._roles_stamp or time.monotonic() - self._roles_read >= RELOAD_INTERVAL:
            self._roles, self._roles_read, self._roles_stamp = self.keys.roles(), time.monotonic(), stamp
            found = self._roles.get(key)
        return found or ("", "")


def _peer_address(fd: int) -> str | None:
    """The remote address of a connection libzmq just accepted (None if it is already gone)."""
    try:
        with socket.socket(fileno=os.dup(fd)) as conn:
            peer = conn.getpeername()
    except OSError:
        return None
    return peer[0] if isinstance(peer, tuple) else str(peer)


# ---------------------------------------------------------------- ZooKeeper


def zk_security(zk: ZkConfig) -> tuple[list[tuple[str, str]], list[ACL] | None]:
    """(auth_data, default_acl) for a kazoo client: nothing unless `zk.auth` is set."""
    if not zk.auth:
        return [], None
    user, _, password = zk.auth.partition(":")
    acl = [make_digest_acl(user, password, all=True)]
    for reader in credential_list(zk.readers):
        name, _, secret = reader.partition(":")
        if name != user:
            acl.append(make_digest_acl(name, secret, read=True))
    return [("digest", zk.auth)], acl
