"""Logging set-up, done once at each entry point."""

from __future__ import annotations

import logging
import sys


def configure(level: str, role: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # kazoo is chatty about every reconnect attempt at INFO.
    logging.getLogger("kazoo.client").setLevel(max(logging.WARNING, logging.root.level))
