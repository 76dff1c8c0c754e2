"""Where everything lives in ZooKeeper. The only module that spells znode paths.

Under `<root>` (`zk.root`): `gcm/` (election, epoch, leader, request keys), `hosts/`, `queues/` (with
their exchanges' placements), `assignments/` (each host's work list), `live/` and `replicas/` (running
exchanges and replicas), `relocations/`, `permissions`, `events` and `commands/`. Every znode, its
kind, data, writer and readers: docs/architecture.md "The ZooKeeper layout".

A host's work list names slots: an exchange id ("x1") runs the exchange, its replica slot ("x1~r",
`replica_slot`) runs that exchange's replica. The HCM's key for an assignment is (queue, slot).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paths:
    root: str = "/roq"

    @property
    def election(self) -> str:
        return f"{self.root}/gcm/election"

    @property
    def epoch(self) -> str:
        return f"{self.root}/gcm/epoch"

    @property
    def leader(self) -> str:
        return f"{self.root}/gcm/leader"

    @property
    def requests(self) -> str:
        return f"{self.root}/gcm/requests"

    def request(self, key: str) -> str:
        return f"{self.root}/gcm/requests/{key}"

    @property
    def hosts(self) -> str:
        return f"{self.root}/hosts"

    def host(self, host: str) -> str:
        return f"{self.root}/hosts/{host}"

    @property
    def queues(self) -> str:
        return f"{self.root}/queues"

    def queue(self, queue: str) -> str:
        return f"{self.root}/queues/{queue}"

    def exchanges(self, queue: str) -> str:
        return f"{self.root}/queues/{queue}/exchanges"

    def exchange(self, queue: str, xid: str) -> str:
        return f"{self.root}/queues/{queue}/exchanges/{xid}"

    @property
    def assignments(self) -> str:
        return f"{self.root}/assignments"

    def host_assignments(self, host: str) -> str:
        return f"{self.root}/assignments/{host}"

    def assignment(self, host: str, queue: str, xid: str) -> str:
        return f"{self.root}/assignments/{host}/{assignment_name(queue, xid)}"

    @property
    def live(self) -> str:
        return f"{self.root}/live"

    def live_queue(self, queue: str) -> str:
        return f"{self.root}/live/{queue}"

    def live_exchange(self, queue: str, xid: str) -> str:
        return f"{self.root}/live/{queue}/{xid}"

    @property
    def replicas(self) -> str:
        return f"{self.root}/replicas"

    def replica_queue(self, queue: str) -> str:
        return f"{self.root}/replicas/{queue}"

    def replica_live(self, queue: str, xid: str) -> str:
        """The running replica of exchange `xid` (its primary's id; a replica slot is read as its primary)."""
        return f"{self.root}/replicas/{queue}/{primary_of(xid)}"

    @property
    def relocations_root(self) -> str:
        return f"{self.root}/relocations"

    def relocations(self, queue: str) -> str:
        return f"{self.root}/relocations/{queue}"

    @property
    def permissions(self) -> str:
        return f"{self.root}/permissions"

    @property
    def events(self) -> str:
        return f"{self.root}/events"

    @property
    def commands_root(self) -> str:
        return f"{self.root}/commands"

    def commands(self, queue: str) -> str:
        return f"{self.root}/commands/{queue}"

    def command(self, queue: str, command_id: str) -> str:
        return f"{self.root}/commands/{queue}/{command_id}"

    def command_report(self, queue: str, command_id: str, xid: str) -> str:
        return f"{self.root}/commands/{queue}/{command_id}/{xid}"

    def base_paths(self) -> list[str]:
        return [f"{self.root}/gcm", self.election, self.requests, self.hosts, self.queues, self.assignments, self.live,
                self.replicas, self.relocations_root, self.commands_root]


def assignment_name(queue: str, xid: str) -> str:
    # '~' cannot appear in a queue name, so the split is unambiguous.
    return f"{queue}~{xid}"


def split_assignment(name: str) -> tuple[str, str]:
    """(queue, slot): "q~x1" → ("q", "x1"), "q~x1~r" → ("q", "x1~r")."""
    queue, _, xid = name.partition("~")
    return queue, xid


REPLICA_SUFFIX = "~r"  # '~' is in no exchange id, so a slot name says which it is


def replica_slot(xid: str) -> str:
    """The slot of exchange `xid`'s replica: "x1" → "x1~r"."""
    return xid + REPLICA_SUFFIX


def is_replica_slot(xid: str) -> bool:
    return xid.endswith(REPLICA_SUFFIX)


def primary_of(slot: str) -> str:
    """The exchange a slot belongs to: "x1~r" → "x1", "x1" → "x1"."""
    return slot.removesuffix(REPLICA_SUFFIX)
