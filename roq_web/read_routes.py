"""The console's and the API's reads: the cluster, its queues and groups, from the sampler's
latest view (roq_web/history.py), and peeks at retained messages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import FastAPI, Query

from roq.names import check_group_name, check_queue_name
from roq_web.access import Caller, HttpError, check_text
from roq_web.gateway import peek
from roq_web.groups import group_detail, group_rows

if TYPE_CHECKING:
    from roq_web.app import Gateway

# ------------------------------------------------------------------ reads

def _view(gateway: Gateway) -> tuple[dict[str, Any], dict[str, Any], float]:
    status, stats, error, sampled_at = gateway.sampler.snapshot()
    if status is None or stats is None:
        gateway.sampler.sample_now()
        status, stats, error, sampled_at = gateway.sampler.snapshot()
    if status is None or stats is None:
        raise HttpError(503, "unavailable", f"the cluster cannot be read: {error or 'no answer yet'}")
    return status, stats, sampled_at


def queue_row(name: str, q: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "exchanges": q.get("exchanges", 0), "running": q.get("running", 0),
            "replicas": q.get("replicas", 1),
            "msgs_in_per_s": q.get("msgs_in_per_s", 0.0), "msgs_out_per_s": q.get("msgs_out_per_s", 0.0),
            "publishers": q.get("publishers", 0), "subscriptions": q.get("subscriptions", 0),
            "retained_bytes": q.get("retained_bytes", 0)}


def queue_rows(stats: dict[str, Any]) -> list[dict[str, Any]]:
    return [queue_row(n, q) for n, q in sorted(stats.get("queues", {}).items())]


def cluster_view(gateway: Gateway) -> dict[str, Any]:
    status, stats, sampled_at = _view(gateway)
    leader = status.get("leader") or None
    leader_id = leader.get("id") if leader else None
    host_stats = stats.get("hosts", {})
    hosts = []
    for h in status.get("hosts", []):
        s = host_stats.get(h["name"], {})
        hosts.append({"name": h["name"], "address": h.get("address"), "capacity": h.get("capacity", 0),
                      "exchanges": h.get("exchanges", 0), "cpu_percent": s.get("cpu_percent"),
                      "memory_percent": s.get("memory_percent"), "memory_used_bytes": s.get("memory_used_bytes"),
                      "cpus": s.get("cpus"), "live": True})
    return {"leader": {"id": leader_id, "endpoint": leader.get("endpoint")} if leader else None,
            "gcms": [{"id": g.get("id"), "endpoint": g.get("endpoint"), "host": g.get("host"),
                      "leader": g.get("id") == leader_id} for g in status.get("gcms", [])],
            "hosts": hosts,
            "queues": queue_rows(stats),
            "placements": [{"queue": n, "id": x["id"], "host": x.get("host"), "running": x.get("running", False),
                            "restarts": x.get("restarts", 0), "msgs_in_per_s": x.get("msgs_in_per_s", 0.0),
                            "msgs_out_per_s": x.get("msgs_out_per_s", 0.0)}
                           for n, q in sorted(stats.get("queues", {}).items()) for x in q.get("by_exchange", [])],
            "events": gateway.sampler.recent_events()[-50:],
            "exchanges": status.get("exchanges", 0), "unplaced": status.get("unplaced", 0),
            "time": sampled_at}


def queue_view(gateway: Gateway, name: str) -> dict[str, Any]:
    info, rules = gateway.sampler.queue_details(name)
    _status, stats, _ = _view(gateway)
    q = stats.get("queues", {}).get(name, {})
    rates = {x["id"]: x for x in q.get("by_exchange", [])}
    exchanges, publishers = [], []
    for x in info.get("exchanges", []):
        live, r = x.get("live") or {}, rates.get(x["id"], {})
        replica = x.get("replica_live") if isinstance(x.get("replica_live"), dict) else {}
        exchanges.append({"id": x["id"], "host": x.get("host"), "running": bool(live),
                          "incarnation": live.get("incarnation"), "endpoint": live.get("pub"),
                          "replica_host": replica.get("host") or x.get("replica"),
                          "restarts": live.get("restarts", r.get("restarts", 0)),
                          **{k: r.get(k, 0) for k in ("msgs_in_per_s", "msgs_out_per_s", "publishers",
                                                      "subscriptions", "retained_bytes")},
                          "latency_p99_ms": r.get("latency_p99_ms")})
        publishers += [{"id": p, "exchange": x["id"], "msgs_per_s": rate} for p, rate in r.get("top_publishers", [])]
    row = queue_row(name, q)
    row["replicas"] = info.get("replicas", row["replicas"])  # the description, as the page's other figures
    row.update(publisher_count=row["publishers"], exchanges=len(info.get("exchanges", [])),
               rules=rules, exchanges_detail=exchanges,
               publishers=sorted(publishers, key=lambda p: -p["msgs_per_s"]),
               subscribers=list(q.get("subscribers", [])), groups=group_rows(q),
               events=gateway.sampler.recent_events(name))
    return row


def queue_stats(gateway: Gateway, name: str) -> dict[str, Any]:
    """The queue's aggregate in the sampler's latest view; QueueNotFoundError for a queue the leader
    does not know (the description is asked at most once per sample)."""
    gateway.sampler.queue_details(check_queue_name(name))
    return _view(gateway)[1].get("queues", {}).get(name, {})


def install_read_routes(app: FastAPI, gateway: Gateway) -> None:
    @app.get("/api/cluster", tags=["cluster"], summary="Leader, GCMs, hosts, queues and recent events")
    def cluster(_who: Caller) -> dict[str, Any]:
        return cluster_view(gateway)

    @app.get("/api/history", tags=["cluster"], summary="Rates of each queue and host over the last minutes")
    def history(_who: Caller, seconds: Annotated[float, Query(gt=0, le=86_400)] = 300.0) -> dict[str, Any]:
        return gateway.sampler.history(seconds)

    @app.get("/api/queues", tags=["queues"], summary="Every queue with its rates")
    def queues(_who: Caller) -> list[dict[str, Any]]:
        return queue_rows(_view(gateway)[1])

    @app.get("/api/queues/{queue}", tags=["queues"], summary="One queue: exchanges, publishers, subscribers, rules")
    def queue(_who: Caller, queue: str) -> dict[str, Any]:
        return queue_view(gateway, check_queue_name(queue))

    @app.get("/api/queues/{queue}/groups", tags=["queues"],
             summary="The queue's consumer groups: members, ready, delayed, in flight, acked, redelivered, ..., lag")
    def groups(_who: Caller, queue: str) -> list[dict[str, Any]]:
        return group_rows(queue_stats(gateway, queue))

    @app.get("/api/queues/{queue}/groups/{group}", tags=["queues"],
             summary="One consumer group: its figures over the queue's exchanges and on each")
    def group(_who: Caller, queue: str, group: str) -> dict[str, Any]:
        return group_detail(queue, queue_stats(gateway, queue), check_group_name(group))

    @app.get("/api/queues/{queue}/commands/{command}", tags=["queues"],
             summary="An admin command's status: what each exchange did with a purge, reset or group delete")
    def command(_who: Caller, queue: str, command: str) -> dict[str, Any]:
        return gateway.admin.command_status(check_queue_name(queue), command)

    @app.get("/api/queues/{queue}/rules", tags=["queues"], summary="The queue's autoscaling rules")
    def rules(_who: Caller, queue: str) -> dict[str, Any]:
        return gateway.admin.queue_rules(check_queue_name(queue))

    @app.get("/api/queues/{queue}/peek", tags=["data"], summary="The latest retained messages of a topic")
    def peek_messages(_who: Caller, queue: str, topic: str = "",
                      limit: Annotated[int, Query(ge=1, le=200)] = 20) -> dict[str, Any]:
        check_text(topic, "topic")
        return {"messages": peek(gateway.config, gateway.metadata, queue, topic, limit)}


