"""Where everything lives in ZooKeeper. The only module that spells znode paths.

    <root>/gcm/election                 kazoo Election contenders
    <root>/gcm/epoch                    data = epoch number; every leader write checks its version
    <root>/gcm/leader                   ephemeral: {id, endpoint, epoch, pid}
    <root>/gcm/requests/<key>           persistent: {op, name, at} of an applied control write (gcm.fence)
    <root>/hosts/<host>                 ephemeral (HCM session): {address, capacity, pid}
    <root>/queues/<queue>               persistent: queue settings
    <root>/queues/<queue>/exchanges/<x> persistent: placement {host}, written by the leader
    <root>/assignments/<host>/<q>~<x>   persistent: the HCM's work list, written with the placement
    <root>/live/<queue>/<x>             ephemeral (HCM session): endpoints of a running exchange
    <root>/relocations/<queue>          persistent: {publisher: {to, from, at}}, written by the leader
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
    def relocations_root(self) -> str:
        return f"{self.root}/relocations"

    def relocations(self, queue: str) -> str:
        return f"{self.root}/relocations/{queue}"

    def base_paths(self) -> list[str]:
        return [f"{self.root}/gcm", self.election, self.requests, self.hosts, self.queues, self.assignments, self.live,
                self.relocations_root]


def assignment_name(queue: str, xid: str) -> str:
    # '~' cannot appear in a queue name, so the split is unambiguous.
    return f"{queue}~{xid}"


def split_assignment(name: str) -> tuple[str, str]:
    queue, _, xid = name.partition("~")
    return queue, xid
