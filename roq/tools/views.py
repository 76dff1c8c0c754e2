"""Terminal views of the control API's answers (rich tables).

On a terminal, tables fit its width; into a pipe or a file they are printed whole (rich would cut
every row at 80 columns there), so `roq queue show q | grep tcp://` sees complete endpoints.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from roq.records import ClusterStats, ExchangeStats, GroupStats, Load, queue_groups

console = Console()
PIPE_WIDTH = 10_000  # columns when not printing to a terminal: never cut a row


def out(stderr: bool = False) -> Console:
    """A console for stdout (or stderr) that cuts nothing when that stream is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPE_WIDTH)


def print_status(status: dict[str, Any]) -> None:
    console = out()
    leader = status["leader"]
    console.print(f"leader: [bold]{leader['id']}[/] at {leader['endpoint']} (epoch {leader['epoch']}, "
                  f"pid {leader['pid']})")
    gcms = Table("GCM", "endpoint", "pid", "metrics", title="GCMs (election order)")
    for g in status["gcms"]:
        gcms.add_row(g.get("id", "?"), g.get("endpoint", "?"), str(g.get("pid", "?")), g.get("metrics") or "off")
    console.print(gcms)
    hosts = Table("host", "zone", "address", "exchanges", "capacity", "pid", "metrics", title="hosts")
    for h in status["hosts"]:
        hosts.add_row(h["name"], h.get("zone") or "-", h["address"], str(h["exchanges"]), str(h["capacity"]),
                      str(h["pid"]), h.get("metrics") or "off")
    console.print(hosts)
    console.print(f"queues: {len(status['queues'])}  exchanges: {status['exchanges']}  "
                  f"unplaced: {status['unplaced']}  replicas: {status.get('replicas', 0)}  "
                  f"unplaced replicas: {status.get('unplaced_replicas', 0)}  moves: {status.get('moves', 0)} "
                  f"(rebalancing {status.get('rebalanced', 0)})")


def print_queue_list(queues: list[dict[str, Any]]) -> None:
    console = out()
    if not queues:
        console.print("no queues")
        return
    from roq.storage_policy import policy_of
    table = Table("queue", "exchanges", "replicas", "placed", "running", "storage")
    for q in queues:
        table.add_row(q["name"], str(q["exchanges"]), str(q.get("replicas", 1)), str(q["placed"]), str(q["running"]),
                      policy_of(q).describe())
    console.print(table)


def print_queue(info: dict[str, Any]) -> None:
    replicated = info.get("replicas", 1) == 2
    columns = ["exchange", "host", *(["replica"] if replicated else []), "publishers endpoint",
               "subscribers endpoint", "msgs/s in"]
    console = out()
    from roq.storage_policy import policy_of
    table = Table(*columns, title=f"queue {info['name']} (replicas {info.get('replicas', 1)}, storage "
                                  f"{policy_of(info).describe()})")
    for x in info["exchanges"]:
        live = x.get("live") or {}
        rate = str(ExchangeStats.from_dict(live["stats"]).msgs_in_per_s) if live.get("stats") else ""
        replica = [_replica_cell(x)] if replicated else []
        table.add_row(x["id"], x["host"] or "(unplaced)", *replica, live.get("pub", "(not running)"),
                      live.get("sub", ""), rate)
    console.print(table)
    print_groups(info)


GROUP_COLUMNS = ("group", "topics", "members", "ready", "delayed", "in flight", "acked", "redelivered",
                 "dead-lettered", "lag (s)")


def group_row(name: str, g: GroupStats) -> list[str]:
    return [escape(name), escape(", ".join(g.topics)) or "(all)", str(g.members), f"{g.ready:,}", f"{g.delayed:,}",
            f"{g.in_flight:,}", f"{g.acked:,}", f"{g.redelivered:,}", f"{g.dead_lettered:,}",
            f"{g.oldest_ready_s:.1f}"]


def print_groups(info: dict[str, Any]) -> None:
    groups = queue_groups(info)
    if groups:
        _group_table(f"consumer groups of {info['name']}", groups)


def _group_table(title: str, groups: dict[str, GroupStats], first: str = "group") -> None:
    table = Table(first, *GROUP_COLUMNS[1:], title=title)
    for name, g in groups.items():
        table.add_row(*group_row(name, g))
    out().print(table)


def print_group_list(queue: str, groups: dict[str, dict[str, Any]]) -> None:
    """`roq group list`: one row per group (`Admin.list_groups`)."""
    if not groups:
        out().print(f"queue {escape(queue)} has no consumer group on its running exchanges")
        return
    _group_table(f"consumer groups of {queue}", {name: GroupStats.from_dict(g) for name, g in groups.items()})


def print_group(shown: dict[str, Any]) -> None:
    """`roq group show`: the group over the queue's exchanges, then each exchange's row (`Admin.describe_group`)."""
    total = GroupStats.from_dict(shown)
    rows = {"all": total, **{xid: GroupStats.from_dict(g) for xid, g in shown["by_exchange"].items()}}
    _group_table(f"group {shown['name']} of queue {shown['queue']} (topics {', '.join(total.topics) or 'all'}; "
                 f"{total.delivered:,} delivered, {total.nacked:,} nacked, {total.held_bytes:,} bytes held)",
                 rows, first="exchange")


def command_lines(status: dict[str, Any], what: str) -> list[str]:
    """What each exchange did with an admin command (`queue.command`'s answer), one line each."""
    lines = [f"{what} (command {status['id']}):"]
    for xid in status["exchanges"]:
        result = status["results"].get(xid)
        if result is not None:
            lines.append(f"  {xid}: {_result_text(result)}")
        elif xid in status["waiting"]:
            lines.append(f"  {xid}: no result yet")
        else:
            lines.append(f"  {xid}: not running: applies it when it starts")
    return lines


def _result_text(result: dict[str, Any]) -> str:
    if result.get("refused"):
        return f"refused: {result['refused']}"
    if result.get("missing"):
        return "has no such group"
    if "frames" in result:
        return (f"dropped {result['messages']:,} retained messages ({result['frames']:,} frames), "
                f"{result['group_messages']:,} group messages, {result['archives']} journals of earlier "
                "incarnations")
    return f"{'deleted, ' if result.get('deleted') else ''}dropped {result.get('dropped', 0):,} messages"


def _replica_cell(x: dict[str, Any]) -> str:
    """Where the exchange's replica is placed, and whether it runs (its replicas/<q>/<x> exists)."""
    if not x.get("replica"):
        return "(unplaced)"
    return f"{x['replica']} ({'running' if x.get('replica_live') else 'not running'})"


def print_rules(name: str, rules: dict[str, Any]) -> None:
    """One row per rule, named by its `roq queue rules` flag (the JSON keeps the stored names)."""
    from gcm.autoscaler import RULE_FLAGS
    table = Table("flag", "value", title=f"autoscaling rules of {name}")
    for key, value in rules.items():
        off = key.startswith("max_") and key != "max_exchanges" and not value
        shown = "off" if off else f"{value:g}" if isinstance(value, float) else str(value)
        table.add_row(RULE_FLAGS.get(key, key), shown)
    out().print(table)


def print_permissions(table: dict[str, Any]) -> None:
    """One row per key entry (`keys.list`), and what a key without one gets."""
    console = out()
    default = table["default"]
    console.print(f"keys without an entry: {escape(default)} "
                  f"({'every right on every queue' if default == 'all' else 'no queue'}); "
                  "keys under admins/: every right")
    if not table["keys"]:
        console.print("no entries")
        return
    rows = Table("key", "certificate", "admin", "publish", "subscribe", "consume")
    for key in table["keys"]:
        rows.add_row(key["name"], key.get("certificate") or "-", "yes" if key["admin"] else "no",
                     *(escape(" ".join(key[right])) or "-" for right in ("publish", "subscribe", "consume")))
    console.print(rows)


def stats_view(snapshot: dict[str, Any]) -> Group:
    """Queues (with their exchanges), hosts and recent scaling events, as one renderable.

    `snapshot`: the answer to `cluster.stats` (a `ClusterStats` on the wire)."""
    cluster = ClusterStats.from_dict(snapshot)
    queues = Table(title="queues")
    queues.add_column("queue / exchange", no_wrap=True)
    queues.add_column("host", no_wrap=True)
    for header in ("msg/s in", "msg/s out", "MB/s in", "pubs", "subs", "drops", "kept MB", "disk MB"):
        queues.add_column(header, justify="right")
    events = Table("queue", "when", "what", title="recent scaling and relocation")
    for name, q in sorted(cluster.queues.items()):
        queues.add_row(f"{name} ({q.running}/{q.exchanges})", "", *_figures(q), style="bold")
        for x in q.by_exchange:
            queues.add_row(f"  {x.id}" + ("" if x.running else " (down)"), x.host or "-", *_figures(x))
        for e in q.events[-5:]:
            when = time.strftime("%H:%M:%S", time.localtime(e["at"]))
            if "relocated" in e:
                what = f"publisher {e['relocated']} {e['from']} → {e['to']} ({e['rate']:,.0f} msg/s)"
            else:
                what = f"{e['from']} → {e['to']} exchanges: {e['reason']}"
                if "carrying_traffic_after_s" in e:
                    what += f" (carrying traffic after {e['carrying_traffic_after_s']} s)"
            events.add_row(name, when, what)
    lag = Table("queue", "durable subscriber", "messages behind", "frames behind", "oldest unread (s)",
                "last report (s ago)", title="consumer lag")
    for name, q in sorted(cluster.queues.items()):
        for sub in q.subscribers:
            lag.add_row(name, escape(sub.name), f"{sub.messages:,}", f"{sub.frames:,}", f"{sub.seconds:,.1f}",
                        f"{sub.reported_ago:,.0f}")
    groups = Table("queue", *GROUP_COLUMNS, title="consumer groups")
    for name, q in sorted(cluster.queues.items()):
        for group, g in q.groups.items():
            groups.add_row(name, *group_row(group, g))
    hosts = Table("host", "CPU %", "memory %", "exchanges", "capacity", title="hosts")
    for name, h in sorted(cluster.hosts.items()):
        hosts.add_row(name, _num(h.cpu_percent), _num(h.memory_percent), str(h.exchanges), str(h.capacity))
    stores = store_table(cluster)
    parts: list[Any] = [queues, *(t for t in (lag, groups, stores) if t.row_count), hosts]
    if events.row_count:
        parts.append(events)
    parts.append(f"as of {time.strftime('%H:%M:%S', time.localtime(cluster.time or time.time()))}")
    return Group(*parts)


def store_table(cluster: ClusterStats) -> Table:
    """The exchanges with a segment store (docs/segment-store.md): how much they keep on disk, and
    from when."""
    table = Table("queue / exchange", "state", "disk MB", "segments", "oldest position", "oldest stored",
                  title="segment stores")
    for name, q in sorted(cluster.queues.items()):
        for x in q.by_exchange:
            if not x.store_state:
                continue
            oldest = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(x.store_oldest_time))
                      if x.store_oldest_time is not None else "-")
            table.add_row(f"{name} / {x.id}", x.store_state, f"{x.store_bytes / 1e6:,.1f}", str(x.store_segments),
                          str(x.store_oldest_pos or "-"), oldest, style="bold red" if x.store_state != "ok" else None)
    return table


def live_stats(fetch: Callable[[], dict[str, Any]], interval: float) -> None:
    """Redraw the view every `interval` until Ctrl-C (KeyboardInterrupt, left to the caller); into
    a pipe or a file, print one whole view after another instead."""
    if not sys.stdout.isatty():
        piped = out()
        while True:
            piped.print(stats_view(fetch()))
            time.sleep(interval)
    with Live(stats_view(fetch()), console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(interval)
            live.update(stats_view(fetch()))


def _figures(row: Load) -> list[str]:
    return [f"{row.msgs_in_per_s:,.0f}", f"{row.msgs_out_per_s:,.0f}", f"{row.bytes_in_per_s / 1e6:,.1f}",
            str(row.publishers), str(row.subscriptions), str(row.drops), f"{row.retained_bytes / 1e6:,.1f}",
            f"{row.store_bytes / 1e6:,.1f}" if row.store_bytes else "-"]


def _num(value: Any) -> str:
    return f"{value:.0f}" if isinstance(value, (int, float)) else "-"
