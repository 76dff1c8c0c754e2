"""Where everything lives in ZooKeeper. The only module that spells znode paths.

    <root>/gcm/election                 kazoo Election contenders
    <root>/gcm/epoch                    data = epoch number; every leader write checks its version
    <root>/gcm/leader                   ephemeral: {id, endpoint, epoch, pid}
    <root>/gcm/requests/<key>           persistent: {op, name, at} of an applied control write (gcm.fence)
    <root>/hosts/<host>                 ephemeral (HCM session): {address, capacity, pid, journal, journals, stats}
    <root>/queues/<queue>               persistent: queue settings (incl. replicas: 1 or 2, absent = 1)
    <root>/queues/<queue>/exchanges/<x> persistent: placement {host} ({host, replica} with replicas 2),
                                        written by the leader; a host is null while unplaced
    <root>/assignments/<host>           persistent: data {journals: true} while the host keeps journals (the leader's)
    <root>/assignments/<host>/<q>~<x>   persistent: the HCM's work list, written with the placement
    <root>/assignments/<host>/<q>~<x>~r persistent: the same for the replica of exchange <x>
    <root>/live/<queue>/<x>             ephemeral (HCM session): endpoints of a running exchange
    <root>/replicas/<queue>/<x>         ephemeral (HCM session): endpoints of exchange <x>'s running replica
    <root>/relocations/<queue>          persistent: {publisher: {to, from, at}}, written by the leader
    <root>/permissions                  persistent: the permission table {format, keys: {name: entry}}
                                        (roq/permissions.py), written by the leader; absent = no entries
    <root>/events                       persistent: {events: [{seq, time, kind, detail, queue}]}, the
                                        cluster's recent events (gcm/events.py), written by the leader
    <root>/commands/<queue>             persistent: {latest, at}, rewritten by the leader with each command
                                        (HCMs watch it); deleted with its queue
    <root>/commands/<queue>/<id>        persistent: an admin command {id, op, queue, group, at, exchanges}
                                        (gcm/commands.py), written by the leader, the newest kept
    <root>/commands/<queue>/<id>/<x>    persistent: exchange <x>'s result of it, written by its HCM

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
