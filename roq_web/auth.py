"""Who is calling the HTTP API, and may they do it (docs/http.md "Security").

Credentials are bearer tokens. `roq web token add NAME --role admin|client` makes one, prints it
once and stores only its SHA-256 in `web.tokens_file` (lines `NAME ROLE SHA256`), so the file on
the gateway's host gives nothing away. The roles are the control API's: a `client` token may read,
publish and subscribe; only an `admin` token may change the cluster.

A browser logs in once (POST /api/session with the token) and gets a session cookie: random,
HttpOnly (no script reads it), SameSite=Strict, Secure under TLS. The token itself never comes back
to the browser. A request authenticated by the cookie that changes anything must also carry the
session's CSRF token in `X-CSRF-Token`; a page of another site can neither read that token nor
set the header without a CORS preflight, which this server never grants. Any unsafe request
that names another origin (`Origin`, `Sec-Fetch-Site: cross-site`) is refused, which also keeps a
hostile page from driving a local demo gateway that runs with `web.auth` off.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from roq.errors import ConfigError
from roq.names import is_name

ROLES = ("admin", "client")
TOKEN_PREFIX = "roq_"
SESSION_COOKIE = "roq_session"
CSRF_HEADER = "x-csrf-token"
MAX_SESSIONS = 10_000  # logins remembered at once; the oldest is logged out beyond it
TOKENS_RELOAD_EVERY = 1.0  # seconds between looks at the tokens file's modification time
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class Identity:
    name: str
    role: str  # "admin" or "client"
    via: str  # "token" (Authorization header), "session" (cookie) or "open" (web.auth off)
    csrf: str = ""  # the session's CSRF token ("" unless via session)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


OPEN = Identity("anonymous", "admin", "open")


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def add_token(path: Path, name: str, role: str) -> str:
    """Append a new token for `name` to the tokens file (made 0600); returns the token."""
    if role not in ROLES:
        raise ConfigError(f"role must be admin or client, not {role!r}")
    if not is_name(name):
        raise ConfigError(f"token name {name!r}: use 1-63 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit")
    existing = read_tokens(path) if path.exists() else {}
    if any(known == name for known, _ in existing.values()):
        raise ConfigError(f"{path} already has a token named {name!r}: choose another name")
    token = new_token()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as out:
        out.write(f"{name} {role} {token_hash(token)}\n")
    return token


def read_tokens(path: Path) -> dict[str, tuple[str, str]]:
    """SHA-256 → (name, role), from a tokens file; a malformed line is a ConfigError naming it."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"web.tokens_file {path}: {exc.strerror or exc}") from None
    tokens: dict[str, tuple[str, str]] = {}
    for number, line in enumerate(text.split("\n"), 1):  # not splitlines(): it splits on \x1e and more
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 3 or parts[1] not in ROLES or len(parts[2]) != 64 \
                or any(c not in "0123456789abcdef" for c in parts[2]):
            raise ConfigError(f"{path} line {number}: expected 'NAME admin|client SHA256', got {line.strip()[:80]!r}")
        tokens[parts[2]] = (parts[0], parts[1])
    return tokens


class Sessions:
    """Console logins: random id → identity, bounded and expiring."""

    def __init__(self, lifetime: float) -> None:
        self.lifetime = lifetime
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, tuple[float, Identity]] = OrderedDict()

    def open(self, name: str, role: str) -> tuple[str, Identity]:
        session_id = secrets.token_urlsafe(32)
        identity = Identity(name, role, "session", secrets.token_urlsafe(24))
        with self._lock:
            self._sessions[session_id] = (time.monotonic() + self.lifetime, identity)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return session_id, identity

    def find(self, session_id: str) -> Identity | None:
        with self._lock:
            entry = self._sessions.get(session_id)
            if entry is None:
                return None
            if entry[0] < time.monotonic():
                del self._sessions[session_id]
                return None
            return entry[1]

    def close(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)


class Guard:
    """Identifies callers (token, session cookie, or nobody) against web.tokens_file, re-read
    when it changes so a token added or removed counts without a restart."""

    def __init__(self, enabled: bool, tokens_file: str, session_seconds: float) -> None:
        self.enabled = enabled
        self.path = Path(tokens_file) if tokens_file else None
        self.sessions = Sessions(session_seconds)
        self._tokens: dict[str, tuple[str, str]] = {}
        self._mtime: float | None = None
        self._looked_at = 0.0
        self._lock = threading.Lock()
        if enabled:
            self._reload(force=True)  # a missing or malformed file stops the gateway at start

    def _reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._looked_at < TOKENS_RELOAD_EVERY:
            return
        self._looked_at = now
        assert self.path is not None
        try:
            mtime = self.path.stat().st_mtime
        except OSError:
            if force:
                raise ConfigError(f"web.tokens_file {self.path} does not exist "
                                  "(make it with `roq web token add NAME --role admin --file F`)") from None
            return  # keep the tokens we had rather than lock everyone out
        if mtime != self._mtime:
            try:
                self._tokens, self._mtime = read_tokens(self.path), mtime
            except ConfigError:
                if force:
                    raise

    def check_token(self, token: str) -> tuple[str, str] | None:
        """(name, role) of a valid token."""
        if not self.enabled:
            return None
        with self._lock:
            self._reload()
            return self._tokens.get(token_hash(token))

    def identify(self, authorization: str | None, session_id: str | None) -> Identity | None:
        """The caller, or None when web.auth is on and they showed nothing valid."""
        if not self.enabled:
            return OPEN
        if authorization:
            scheme, _, token = authorization.partition(" ")
            found = self.check_token(token.strip()) if scheme.lower() == "bearer" else None
            return Identity(found[0], found[1], "token") if found else None
        if session_id:
            identity = self.sessions.find(session_id)
            if identity is not None and self.check_token_name_still_valid(identity):
                return identity
        return None

    def check_token_name_still_valid(self, identity: Identity) -> bool:
        """A session lasts while its token's name is still in the file with the same role."""
        with self._lock:
            self._reload()
            return (identity.name, identity.role) in self._tokens.values()


def trusted_host(host: str | None, names: str) -> bool:
    """With web.auth off: whether a request's Host names this gateway as a browser may, i.e. not
    through a name an attacker controls (DNS rebinding). IP addresses and localhost are trusted,
    other names only when listed in `names` (web.hosts)."""
    if not host:
        return True  # HTTP/1.0 without Host: not a browser
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return name in {n.strip().lower() for n in names.split(",") if n.strip()}


def cross_site(method: str, origin: str | None, fetch_site: str | None, host: str | None) -> bool:
    """An unsafe request sent by a page of another site (a CSRF attempt), by the headers browsers
    add on their own: Origin, and Sec-Fetch-Site. curl and other non-browser clients send neither."""
    if method not in UNSAFE_METHODS:
        return False
    if fetch_site == "cross-site":
        return True
    if not origin:
        return False
    if origin == "null":
        return True
    return urlsplit(origin).netloc.lower() != (host or "").lower()
