"""A queue's storage policy: how long, and how many bytes, its exchanges keep frames on disk.

`retention` (seconds) and `retention_bytes` live in the queue's settings znode beside `replicas`;
both 0 (or absent: a queue made before policies existed) is memory only, today's behaviour. When
either is set the queue's frames wait on the exchange host's disk (exchange/segment_store.py); a
bound that is 0 does not apply (the other one does). The leader checks the values (`check_policy`),
fills in gcm.default_retention / gcm.default_retention_bytes at create, and the HCMs hand the
policy to each exchange of the queue (`storage_line`, hcm/storage_policies.py). The CLI reads human
units (`parse_duration`, `parse_size`); the wire carries plain numbers.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from roq.errors import UserError

MAX_RETENTION = 100 * 365 * 86_400.0  # seconds: a century (anything longer is a typo)
MAX_RETENTION_BYTES = 1 << 60  # an exabyte: beyond every disk, below msgpack's integer range
POLICY_ARGS = ("retention", "retention_bytes")  # of queue.create and queue.set
LINE_KEY = "storage"  # the HCM's line to an exchange: {"storage": {"retention", "retention_bytes"}}

DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3_600.0, "d": 86_400.0, "w": 604_800.0}
SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
              "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")


@dataclass(frozen=True)
class StoragePolicy:
    retention: float = 0.0  # seconds a frame is kept on disk; 0: no age bound
    retention_bytes: int = 0  # bytes of frames kept on disk per exchange; 0: no size bound

    @property
    def on_disk(self) -> bool:
        """Whether the queue keeps frames on disk at all (both 0: memory only)."""
        return self.retention > 0 or self.retention_bytes > 0

    def to_dict(self) -> dict[str, Any]:
        return {"retention": self.retention, "retention_bytes": self.retention_bytes}

    def describe(self) -> str:
        """In words, for the CLI: "memory only", "on disk for 1d, up to 50 GiB"."""
        if not self.on_disk:
            return "memory only"
        age = f"for {format_duration(self.retention)}" if self.retention else "with no age limit"
        size = f"up to {format_size(self.retention_bytes)}" if self.retention_bytes else "with no size limit"
        return f"on disk {age}, {size}"


def check_retention(value: Any) -> float:
    """A wire value of `retention`: seconds, a number from 0 to MAX_RETENTION."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value <= MAX_RETENTION:
        raise UserError(f"retention must be a number of seconds from 0 (no age limit) to {MAX_RETENTION:.0f}, "
                        f"got {value!r}")
    return float(value)


def check_retention_bytes(value: Any) -> int:
    """A wire value of `retention_bytes`: an integer from 0 to MAX_RETENTION_BYTES."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETENTION_BYTES:
        raise UserError(f"retention_bytes must be an integer from 0 (no size limit) to {MAX_RETENTION_BYTES}, "
                        f"got {value!r}")
    return value


def policy_of(settings: dict[str, Any]) -> StoragePolicy:
    """The policy a queue's settings hold; absent keys, or values that fail the checks (a hand edit
    of ZooKeeper), count as 0: a daemon never crashes on them."""
    try:
        retention = check_retention(settings.get("retention", 0))
    except UserError:
        retention = 0.0
    try:
        retention_bytes = check_retention_bytes(settings.get("retention_bytes", 0))
    except UserError:
        retention_bytes = 0
    return StoragePolicy(retention, retention_bytes)


def storage_line(policy: StoragePolicy) -> dict[str, Any]:
    """What the HCM writes to an exchange (one JSON line) at its start and whenever the policy changes."""
    return {LINE_KEY: policy.to_dict()}


def policy_from_line(message: dict[str, Any]) -> StoragePolicy | None:
    """The policy in a line from the HCM; None if the line carries none or a malformed one."""
    found = message.get(LINE_KEY)
    return policy_of(found) if isinstance(found, dict) else None


# -- human units (the CLI) -----------------------------------------------------------------------

def parse_duration(text: str) -> float:
    """Seconds from "90", "30s", "15m", "24h", "7d", "2w", "1h30m", "250ms"; UserError otherwise."""
    spoken = text.strip().lower()
    try:
        return check_retention(float(spoken))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(spoken)
    if not parts or "".join(f"{n}{u}" for n, u in parts) != spoken.replace(" ", ""):
        raise UserError(f"{text!r} is not a duration: use a number of seconds or units like 30s, 15m, 24h, 7d, "
                        "2w, 1h30m")
    return check_retention(sum(float(number) * DURATION_UNITS[unit] for number, unit in parts))


def parse_size(text: str) -> int:
    """Bytes from "1048576", "512MiB", "50GiB", "1.5TB" (KB, MB, GB, TB: powers of 1000; KiB, MiB,
    GiB, TiB: powers of 1024); UserError otherwise, a fraction of a byte included."""
    match = _SIZE.fullmatch(text.strip().lower().replace(" ", ""))
    if match is None or match.group(2) not in SIZE_UNITS:
        raise UserError(f"{text!r} is not a size: use a number of bytes, or units KB, MB, GB, TB (powers of 1000) "
                        "or KiB, MiB, GiB, TiB (powers of 1024), as in 50GiB")
    number, unit = match.groups()
    exact = float(number) * SIZE_UNITS[unit] if "." in number else int(number) * SIZE_UNITS[unit]
    if exact != int(exact):
        raise UserError(f"{text!r} is not a whole number of bytes")
    return check_retention_bytes(int(exact))


def format_duration(seconds: float) -> str:
    """The largest unit that divides it: 86400 -> "1d", 5400 -> "90m", 1.5 -> "1.5s"."""
    for unit in ("w", "d", "h", "m"):
        size = DURATION_UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"  # never an exponent: "1e+06s" would not read back


def format_size(size: int) -> str:
    """The largest binary or decimal unit that divides it: 53687091200 -> "50 GiB"."""
    for unit in ("pib", "pb", "tib", "tb", "gib", "gb", "mib", "mb", "kib", "kb"):
        factor = SIZE_UNITS[unit]
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit[0].upper() + 'iB' if unit.endswith('ib') else unit.upper()}"
    return f"{size} B"
