"""RoQ: an elastic publish/subscribe exchange cluster coordinated by ZooKeeper."""

from __future__ import annotations

__version__ = "0.1.0"
