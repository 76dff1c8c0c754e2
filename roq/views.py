"""Terminal views of the control API's answers (rich tables)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()


def print_status(status: dict[str, Any]) -> None:
    leader = status["leader"]
    console.print(f"leader: [bold]{leader['id']}[/] at {leader['endpoint']} (epoch {leader['epoch']}, "
                  f"pid {leader['pid']})")
    gcms = Table("GCM", "endpoint", "pid", title="GCMs (election order)")
    for g in status["gcms"]:
        gcms.add_row(g.get("id", "?"), g.get("endpoint", "?"), str(g.get("pid", "?")))
    console.print(gcms)
    hosts = Table("host", "address", "exchanges", "capacity", "pid", title="hosts")
    for h in status["hosts"]:
        hosts.add_row(h["name"], h["address"], str(h["exchanges"]), str(h["capacity"]), str(h["pid"]))
    console.print(hosts)
    console.print(f"queues: {len(status['queues'])}  exchanges: {status['exchanges']}  "
                  f"unplaced: {status['unplaced']}")


def print_queue_list(queues: list[dict[str, Any]]) -> None:
    if not queues:
        console.print("no queues")
        return
    table = Table("queue", "exchanges", "placed", "running")
    for q in queues:
        table.add_row(q["name"], str(q["exchanges"]), str(q["placed"]), str(q["running"]))
    console.print(table)


def print_queue(info: dict[str, Any]) -> None:
    table = Table("exchange", "host", "publishers endpoint", "subscribers endpoint", "msgs/s in",
                  title=f"queue {info['name']}")
    for x in info["exchanges"]:
        live = x.get("live") or {}
        stats = live.get("stats") or {}
        table.add_row(x["id"], x["host"] or "(unplaced)", live.get("pub", "(not running)"),
                      live.get("sub", ""), str(stats.get("msgs_in_per_s", "")))
    console.print(table)
