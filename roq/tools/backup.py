"""Backup files of a cluster's metadata: `roq backup FILE` and `roq restore FILE` (docs/backup.md).

The document itself — its fields, its checks, its limits — is gcm/backup_document.py; the leader
makes one (`backup.export`) and applies one (`restore`, gcm/backups.py) over the control API, so
neither command opens a ZooKeeper session. This module is the file around it: `fetch()` asks the
leader for the document and adds the public keys of the operator's keys directory (the public
halves of `server.key`, `clients/*.key` and `admins/*.key`; never a secret), `write()` replaces the
file atomically (a temporary file in the same directory, fsynced, renamed), mode 0600, and `load()`
reads and checks a whole file before a restore sends anything.

Tooling, not core: it validates with the leader's checks (gcm.backup_document), which the core may
not import (the import-linter contracts in pyproject.toml).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import zmq.auth

from gcm.backup_document import (  # noqa: F401  (the public names of the backup format, kept here too)
    BOOKKEEPING,
    FORMAT,
    KEY_KINDS,
    MAX_DOCUMENT_BYTES,
    SERVER_KEY,
    VERSION,
    Backup,
    PublicKeys,
    QueueBackup,
    entries_text,
    is_z85_key,
    parse,
    plural,
)
from roq.client.admin import Admin
from roq.errors import NoLeaderError, NoSeedsError, UserError
from roq.names import check_subscriber_name

Echo = Callable[[str], None]


# ---------------------------------------------------------------- backup


def fetch(admin: Admin, keys_dir: str | None, warn: Echo = lambda _: None) -> Backup:
    """The leader's backup document, with the public keys of `keys_dir` (None: no keys), checked whole."""
    try:
        document = admin.call("backup.export")
    except (NoLeaderError, NoSeedsError) as exc:  # no GCM answers: say what the operator looks for first
        raise UserError(f"there is no RoQ cluster under {admin.config.zk.root} answering at "
                        f"{', '.join(admin.seeds)} ({exc})") from None
    backup = replace(parse(document, "the leader's backup"), keys=read_public_keys(keys_dir, warn))
    # What we write must restore: the same checks as `load`, on the document itself.
    parse(json.loads(json.dumps(backup.to_json())), "the backup being written")
    return backup


def read_public_keys(keys_dir: str | None, warn: Echo = lambda _: None) -> PublicKeys:
    """The public halves only: `load_certificate`'s secret, should a `.key` file hold one, is dropped."""
    if not keys_dir:
        return PublicKeys()
    root = Path(keys_dir)
    if not root.is_dir():
        raise UserError(f"keys directory {root} is not a directory (security.keys_dir or --keys-dir)")
    server = None
    for candidate in (root / SERVER_KEY, root / "server.key_secret"):  # a daemon's dir may hold only the pair
        if candidate.exists():
            server = _public_of(candidate, warn)
            break
    found: dict[str, dict[str, str]] = {kind: {} for kind in KEY_KINDS}
    for kind in KEY_KINDS:
        folder = root / kind
        for cert in sorted(folder.glob("*.key")) if folder.is_dir() else []:
            try:
                name = check_subscriber_name(cert.stem)
            except UserError:
                warn(f"skipped {kind}/{cert.name}: its name cannot be restored (letters, digits, '_', '.', '-')")
                continue
            key = _public_of(cert, warn)
            if key is not None:
                found[kind][name] = key
    return PublicKeys(server, found["clients"], found["admins"])


def _public_of(cert: Path, warn: Echo) -> str | None:
    try:
        public, _secret = zmq.auth.load_certificate(str(cert))
    except (OSError, ValueError) as exc:
        warn(f"skipped unreadable certificate {cert}: {exc}")
        return None
    key = public.decode("ascii", errors="replace")
    if not is_z85_key(key):
        warn(f"skipped certificate {cert}: its public key is not a 40-character Z85 key")
        return None
    return key


def write(path: str | os.PathLike[str], backup: Backup) -> Path:
    """Replace `path` atomically with the backup, mode 0600 whatever the umask."""
    target = Path(path)
    data = (json.dumps(backup.to_json(), indent=2) + "\n").encode()
    try:
        write_new(target, data, 0o600, replace=True)
    except OSError as exc:
        raise UserError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target


def write_new(target: Path, data: bytes, mode: int, replace: bool) -> bool:
    """Write `data` to a temporary file beside `target`, fsync it, then rename it over `target`
    (`replace`) or link it there only if `target` does not exist. False: it existed (not replaced)."""
    directory = target.absolute().parent
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(temp, target)
        else:
            try:
                os.link(temp, target)
            except FileExistsError:
                return False
            finally:
                os.unlink(temp)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True


# ---------------------------------------------------------------- validation


def load(path: str | os.PathLike[str]) -> Backup:
    """The backup in `path`, checked whole; a UserError naming the file and the first fault."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise UserError(f"{path} is not a backup this roq restores: {len(raw)} bytes, at most {MAX_DOCUMENT_BYTES}")
    try:
        document = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not a RoQ backup: not valid JSON ({exc})") from None
    return parse(document, str(path))

