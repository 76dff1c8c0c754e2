"""The web console and HTTP API (docs/http.md): a FastAPI application over one RoQ client.

Reads are served from the sampler's latest view of the cluster (roq_web/history.py); admin actions
go to the leader through `Admin`, with the gateway's own identity (`security.identity`), once
the caller showed an admin credential (roq_web/auth.py); publishing and streaming go through
roq_web/gateway.py, within the bounds of roq_web/limits.py (per caller and in all: slots, a memory budget,
bodies counted as they arrive). Errors are JSON, `{"error": code, "message": text}`, the codes of
the control API (docs/protocol.md), with the HTTP status that fits.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import fastapi_offline
from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from kazoo.client import KazooClient
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from roq import __version__
from roq.client import Subscriber
from roq.client.admin import Admin
from roq.client.envelope import decode_envelope
from roq.config import Config
from roq.errors import (
    BackpressureError,
    CommandNotFoundError,
    ForbiddenError,
    GroupNotFoundError,
    LimitExceededError,
    MessageTooLargeError,
    PreconditionFailedError,
    QueueExistsError,
    QueueNotFoundError,
    RefusedError,
    RoqError,
    UnavailableError,
    UserError,
)
from roq.names import check_group_name, check_queue_name, check_topic
from roq.permissions import MAX_PATTERNS, check_key_name
from roq.protocol import check_headers
from roq.zk import start_client, stop_client
from roq_web.auth import CSRF_HEADER, SESSION_COOKIE, UNSAFE_METHODS, Guard, Identity, cross_site, trusted_host
from roq_web.gateway import Publishers, Streams, TokenWriter, next_events, peek
from roq_web.groups import command_status_code, group_detail, group_rows
from roq_web.history import Sampler
from roq_web.limits import CallerLimitError, Limits, read_envelope, read_messages

STATIC = Path(__file__).parent / "static"
# Swagger UI 5 (it renders OpenAPI 3.1, which FastAPI writes; 4.x cannot), as fastapi-offline ships it.
SWAGGER_UI = Path(fastapi_offline.__file__).parent / "static"
KEEPALIVE_SECONDS = 15.0
START_POINTS = ("now", "beginning")
PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")

STATUS_BY_ERROR: list[tuple[type[RoqError], int]] = [
    (QueueNotFoundError, 404), (GroupNotFoundError, 404), (CommandNotFoundError, 404), (QueueExistsError, 409),
    (LimitExceededError, 409), (ForbiddenError, 403),
    # if_empty / if_unused that do not hold, a group with members: the queue's state conflicts with the
    # request (409 rather than 412, which is for conditional headers such as If-Match).
    (PreconditionFailedError, 409),
    (RefusedError, 403),  # the exchanges refuse the gateway's key: it lacks the right on that queue
    (MessageTooLargeError, 413), (CallerLimitError, 429), (BackpressureError, 429), (UserError, 400),
    (UnavailableError, 503),
]


class HttpError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def error_response(status: int, code: str, message: str) -> JSONResponse:
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


# ------------------------------------------------------------------ request bodies

class Login(BaseModel):
    token: str = Field(max_length=512)


class NewQueue(BaseModel):
    name: str = Field(max_length=64)
    exchanges: int | None = Field(None, ge=1, le=1000)  # None: 1 (with exist_ok: not compared)
    replicas: int | None = Field(None, ge=1, le=2)
    exist_ok: bool = False  # an existing queue with the settings named is success (200, not 201)


class Scale(BaseModel):
    exchanges: int = Field(ge=1, le=1000)


class Rules(BaseModel):
    rules: dict[str, Any] | None = None
    clear: bool = False


Patterns = Annotated[list[str], Field(max_length=MAX_PATTERNS)]


class Rights(BaseModel):
    """Queue patterns (names with * and ?) per right, and admin: what a grant adds or a revoke takes."""
    publish: Patterns = []
    subscribe: Patterns = []
    consume: Patterns = []
    admin: bool = False


class Revocation(Rights):
    all: bool = False  # every right (so does naming none)


# ------------------------------------------------------------------ the application

class Gateway:
    """Everything the routes share: one ZooKeeper session, the leader's client, the data path."""

    def __init__(self, config: Config, zk: KazooClient | None = None) -> None:
        self.config = config
        self.guard = Guard(config.web.auth, config.web.tokens_file, config.web.session_seconds)
        self._own_zk = zk is None
        self.zk = zk or start_client(config)
        self.admin = Admin(config, client=self.zk)
        self.sampler = Sampler(self.admin, config.web.sample_interval, config.web.history_seconds)
        self.publishers = Publishers(config, self.zk)
        self.limits = Limits(config.web, config.exchange.max_message_bytes, config.client.max_unconfirmed)
        self.streams = Streams(config, self.zk)
        # Threads for blocking subscriber reads, apart from the pool the other routes use.
        self.stream_threads = anyio.CapacityLimiter(config.web.max_streams + 4)
        self.closing = threading.Event()  # set first when the gateway stops: open streams end

    def start(self) -> None:
        self.sampler.start()

    def close(self) -> None:
        self.sampler.stop()
        self.publishers.close()
        self.admin.close()
        if self._own_zk:
            stop_client(self.zk)


def create_app(config: Config, zk: KazooClient | None = None) -> FastAPI:
    gateway = Gateway(config, zk)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        gateway.start()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_close_idle_publishers, gateway)
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()
                await run_in_threadpool(gateway.close)

    app = FastAPI(title="RoQ HTTP API", version=__version__, docs_url=None, redoc_url=None, lifespan=lifespan,
                  description="The cluster, its queues, publishing and streaming over HTTP. See docs/http.md.")
    app.state.gateway = gateway
    _install_errors(app)
    _install_security_headers(app)
    _install_pages(app)
    _install_session_routes(app, gateway)
    _install_read_routes(app, gateway)
    _install_admin_routes(app, gateway)
    _install_command_routes(app, gateway)
    _install_permission_routes(app, gateway)
    _install_data_routes(app, gateway)
    return app


async def _close_idle_publishers(gateway: Gateway) -> None:
    while True:
        # A periodic sweep: nothing to wait for but time.
        await anyio.sleep(max(1.0, gateway.config.web.idle_publisher_seconds / 10))
        await run_in_threadpool(gateway.publishers.close_idle)


def _install_errors(app: FastAPI) -> None:
    @app.exception_handler(HttpError)
    async def http_error(_request: Request, exc: HttpError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors())
        return error_response(400, "bad_request", problems or "bad request")

    @app.exception_handler(RoqError)
    async def roq_error(_request: Request, exc: RoqError) -> JSONResponse:
        status = next((s for cls, s in STATUS_BY_ERROR if isinstance(exc, cls)), 500)
        return error_response(status, exc.code, str(exc))


# Every page, /docs included (Swagger UI's start-up script is a file, docs.js, not inline).
SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"), (b"content-security-policy", PAGE_POLICY.encode())]


class SecurityHeaders:
    """Adds the security headers to every answer: a plain ASGI middleware, which costs far less per
    request than Starlette's BaseHTTPMiddleware (@app.middleware)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(n, v) for n, v in SECURITY_HEADERS if n not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _install_security_headers(app: FastAPI) -> None:
    app.add_middleware(SecurityHeaders)


def _install_pages(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static")
    app.mount("/docs-assets", StaticFiles(directory=SWAGGER_UI), name="docs-assets")

    @app.get("/", include_in_schema=False)
    def overview_page() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/queues/{queue}", include_in_schema=False)
    def queue_page(queue: str) -> FileResponse:
        return FileResponse(STATIC / "queue.html", headers={"Cache-Control": "no-cache"})

    @app.get("/docs", include_in_schema=False)
    def docs() -> FileResponse:
        return FileResponse(STATIC / "docs.html", headers={"Cache-Control": "no-cache"})


# ------------------------------------------------------------------ who is calling

def caller(request: Request) -> Identity:
    """The caller's identity (401 without a valid credential when web.auth is on); an unsafe
    request is also checked against CSRF."""
    guard: Guard = request.app.state.gateway.guard
    who = guard.identify(request.headers.get("authorization"), request.cookies.get(SESSION_COOKIE))
    if who is None:
        raise HttpError(401, "unauthorized", "log in: this gateway needs a token (Authorization: Bearer TOKEN)")
    if not guard.enabled and not trusted_host(request.headers.get("host"), request.app.state.gateway.config.web.hosts):
        raise HttpError(403, "host", "refused: this gateway runs without web.auth and does not know the host name "
                                     "in this request (add it to web.hosts)")
    refuse_cross_site(request)
    if who.via == "session" and request.method in UNSAFE_METHODS and request.headers.get(CSRF_HEADER) != who.csrf:
        raise HttpError(403, "csrf", "refused: missing or wrong X-CSRF-Token (reload the page)")
    return who


def refuse_cross_site(request: Request) -> None:
    if cross_site(request.method, request.headers.get("origin"), request.headers.get("sec-fetch-site"),
                  request.headers.get("host")):
        raise HttpError(403, "csrf", "refused: the request came from a page of another site")


def admin_caller(who: Annotated[Identity, Depends(caller)]) -> Identity:
    if not who.is_admin:
        raise HttpError(403, "forbidden", f"refused: {who.name} has the {who.role} role; creating, scaling, "
                                          "purging, deleting queues, resetting and deleting consumer groups, "
                                          "changing rules and permissions need the admin role")
    return who


def share_of(request: Request, who: Identity) -> str:
    """Whose share of the gateway a request counts against: its token's name with web.auth on (a
    proxy in front may hide the addresses), its peer's address with it off."""
    if who.via != "open":
        return f"token {who.name}"
    return f"address {request.client.host if request.client else 'unknown'}"


Caller = Annotated[Identity, Depends(caller)]
AdminCaller = Annotated[Identity, Depends(admin_caller)]


def _install_session_routes(app: FastAPI, gateway: Gateway) -> None:
    guard = gateway.guard

    @app.get("/api/session", tags=["session"], summary="Who the console is logged in as")
    def session(request: Request) -> dict[str, Any]:
        who = guard.identify(None, request.cookies.get(SESSION_COOKIE))
        if who is None:
            return {"auth": True, "name": None, "role": None, "csrf": None}
        return {"auth": guard.enabled, "name": who.name, "role": who.role, "csrf": who.csrf or "open"}

    @app.post("/api/session", tags=["session"], summary="Log in with a token (sets an HttpOnly cookie)")
    def login(request: Request, body: Login, response: Response) -> dict[str, Any]:
        refuse_cross_site(request)
        if not guard.enabled:
            return {"auth": False, "name": "anonymous", "role": "admin", "csrf": "open"}
        found = guard.check_token(body.token.strip())
        if found is None:
            raise HttpError(401, "unauthorized", "unknown token")
        session_id, who = guard.sessions.open(*found)
        secure = bool(gateway.config.web.tls_cert) or gateway.config.web.secure_cookies
        response.set_cookie(SESSION_COOKIE, session_id, max_age=int(gateway.config.web.session_seconds),
                            httponly=True, samesite="strict", secure=secure, path="/")
        return {"auth": True, "name": who.name, "role": who.role, "csrf": who.csrf}

    @app.delete("/api/session", tags=["session"], summary="Log out")
    def logout(request: Request, response: Response) -> dict[str, Any]:
        session_id = request.cookies.get(SESSION_COOKIE)
        if session_id:
            guard.sessions.close(session_id)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return {"auth": guard.enabled, "name": None, "role": None, "csrf": None}


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


def _install_read_routes(app: FastAPI, gateway: Gateway) -> None:
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
        _check_text(topic, "topic")
        return {"messages": peek(gateway.config, gateway.zk, queue, topic, limit)}


# ------------------------------------------------------------------ admin actions

def _install_admin_routes(app: FastAPI, gateway: Gateway) -> None:
    admin, sampler = gateway.admin, gateway.sampler

    @app.post("/api/queues", tags=["admin"], status_code=201,
              summary="Create a queue (admin); with exist_ok, one that exists with the settings named is 200",
              responses={200: {"description": "exist_ok: the queue existed with the settings named"}})
    def create_queue(_who: AdminCaller, body: NewQueue, response: Response) -> dict[str, Any]:
        existed = bool(admin.create_queue(body.name, body.exchanges, body.replicas, exist_ok=body.exist_ok)
                       .get("existed"))
        if existed:
            response.status_code = 200
        sampler.sample_now()
        return {**queue_view(gateway, body.name), "existed": existed}

    @app.post("/api/queues/{queue}/scale", tags=["admin"], summary="Change the number of exchanges (admin)")
    def scale_queue(_who: AdminCaller, queue: str, body: Scale) -> dict[str, Any]:
        admin.scale_queue(check_queue_name(queue), body.exchanges)
        sampler.sample_now()
        return queue_view(gateway, queue)

    @app.delete("/api/queues/{queue}", tags=["admin"],
                summary="Delete a queue (admin); if_empty, if_unused: only if it holds no message, has no client")
    def delete_queue(_who: AdminCaller, queue: str, if_empty: bool = False, if_unused: bool = False) -> dict[str, Any]:
        admin.delete_queue(check_queue_name(queue), if_empty=if_empty, if_unused=if_unused)
        sampler.sample_now()
        return {"deleted": queue}

    @app.put("/api/queues/{queue}/rules", tags=["admin"], summary="Set or clear autoscaling rules (admin)")
    def set_rules(_who: AdminCaller, queue: str, body: Rules) -> dict[str, Any]:
        rules = admin.queue_rules(check_queue_name(queue), body.rules, body.clear)
        sampler.sample_now()  # the queue page shows the new rules at once
        return rules


# ------------------------------------------------------------------ purges and consumer groups

Wait = Annotated[float, Query(ge=0, le=60, description="seconds to wait for every running exchange's result")]


def _install_command_routes(app: FastAPI, gateway: Gateway) -> None:
    """Admin commands the exchanges apply (roq_web/groups.py): 200 once all running ones did, 202 before."""
    admin = gateway.admin

    def answer(status: dict[str, Any], response: Response) -> dict[str, Any]:
        gateway.sampler.sample_now()  # the figures after the command, at the next read
        response.status_code = command_status_code(status)
        return status

    @app.post("/api/queues/{queue}/purge", tags=["admin"],
              summary="Drop the queue's retained messages and every group's ready and delayed ones (admin)")
    def purge_queue(_who: AdminCaller, queue: str, response: Response, wait: Wait = 10.0) -> dict[str, Any]:
        return answer(admin.purge_queue(check_queue_name(queue), wait=wait), response)

    @app.post("/api/queues/{queue}/groups/{group}/reset", tags=["admin"],
              summary="Drop a group's ready and delayed messages; its members keep what they hold (admin)")
    def reset_group(_who: AdminCaller, queue: str, group: str, response: Response,
                    wait: Wait = 10.0) -> dict[str, Any]:
        return answer(admin.reset_group(check_queue_name(queue), check_group_name(group), wait=wait), response)

    @app.delete("/api/queues/{queue}/groups/{group}", tags=["admin"],
                summary="Delete a group with its messages; refused while it has members (admin)")
    def delete_group(_who: AdminCaller, queue: str, group: str, response: Response,
                     wait: Wait = 10.0) -> dict[str, Any]:
        return answer(admin.delete_group(check_queue_name(queue), check_group_name(group), wait=wait), response)


# ------------------------------------------------------------------ permissions

def _install_permission_routes(app: FastAPI, gateway: Gateway) -> None:
    """Who may do what, per queue (docs/security.md "Permissions"): the leader's keys.* operations,
    for admin tokens only, made with the gateway's own key (which must be an admin's)."""
    admin = gateway.admin

    @app.get("/api/permissions", tags=["permissions"], summary="Every key's permissions (admin)")
    def permissions(_who: AdminCaller) -> dict[str, Any]:
        return admin.permissions()

    @app.get("/api/permissions/{key}", tags=["permissions"], summary="One key's permissions (admin)")
    def key_permissions(_who: AdminCaller, key: str) -> dict[str, Any]:
        return admin.key_permissions(check_key_name(key))

    @app.post("/api/permissions/{key}/grant", tags=["permissions"],
              summary="Add queue patterns (or admin) to a key's permissions (admin)")
    def grant(_who: AdminCaller, key: str, body: Rights) -> dict[str, Any]:
        return admin.grant(check_key_name(key), body.publish, body.subscribe, body.consume, body.admin)

    @app.post("/api/permissions/{key}/revoke", tags=["permissions"],
              summary="Take queue patterns (or admin, or everything) from a key's permissions (admin)")
    def revoke(_who: AdminCaller, key: str, body: Revocation) -> dict[str, Any]:
        return admin.revoke(check_key_name(key), body.publish, body.subscribe, body.consume, body.admin, body.all)

    @app.delete("/api/permissions/{key}", tags=["permissions"],
                summary="Remove a key's entry: it gets security.default_permissions again (admin)")
    def reset(_who: AdminCaller, key: str) -> dict[str, Any]:
        return admin.reset_permissions(check_key_name(key))


# ------------------------------------------------------------------ publish and stream

def _install_data_routes(app: FastAPI, gateway: Gateway) -> None:
    @app.post("/api/queues/{queue}/messages", tags=["data"],
              summary="Publish the body as one message (or one per line, or a JSON envelope), answered after the "
                      "confirm",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    async def publish(request: Request, who: Caller, queue: str, topic: str,
                      split: Annotated[str | None, Query(pattern="^lines$")] = None,
                      envelope: Annotated[str | None, Query(pattern="^json$")] = None,
                      idempotency_key: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        _check_text(topic, "topic")
        check_queue_name(queue)  # refused before a byte of the body is read
        check_topic(topic)
        if split and envelope:
            raise HttpError(400, "bad_request", "split=lines and envelope=json do not go together")
        common = request_headers(request.headers.raw)
        limits = gateway.limits
        _refuse_declared_size(request, limits.body.max_bytes if split or envelope else
                              min(limits.body.max_bytes, limits.body.max_message_bytes))
        with limits.publishing(share_of(request, who)) as reservation:
            headers: list[dict[str, bytes]] | None = None
            if envelope:
                payloads, headers = [], []
                for item in await read_envelope(request.stream(), limits.body, reservation):
                    payload, own = decode_envelope(item)
                    payloads.append(payload)
                    headers.append(check_headers({**common, **own}) if common else own)
            else:
                payloads = await read_messages(request.stream(), limits.body, split == "lines", reservation)
                if common:
                    headers = [common] * len(payloads)
            return await run_in_threadpool(gateway.publishers.publish, queue, topic, payloads, who.name,
                                           idempotency_key, headers)

    @app.get("/api/queues/{queue}/stream", tags=["data"], response_class=StreamingResponse,
             summary="Server-Sent Events: the queue's messages, resumable with Last-Event-ID",
             responses={200: {"content": {"text/event-stream": {}}}})
    async def stream(request: Request, who: Caller, queue: str, topic: Annotated[list[str] | None, Query()] = None,
                     start: Annotated[str, Query(alias="from", pattern="^(now|beginning)$")] = "now",
                     position: str | None = None, limit: Annotated[int | None, Query(ge=1)] = None,
                     last_event_id: Annotated[str | None, Header()] = None) -> StreamingResponse:
        token = last_event_id or position
        for t in topic or []:
            _check_text(t, "topic")
        share = share_of(request, who)
        subscriber = await run_in_threadpool(gateway.streams.open, queue, topic or [], start, token, share)
        return StreamingResponse(_events(gateway, subscriber, share, limit), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


HEADER_PREFIX = b"roq-header-"  # `RoQ-Header-Trace-Id: 4bf9` publishes header "trace-id" (names: any case)


def request_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, bytes]:
    """A message's headers from the request's `RoQ-Header-<key>` headers: the key is the rest of the
    name, lower-cased (HTTP names have no case), the value its bytes as sent. Checked as
    `publish()` checks them (a repeated name, an oversize value: 400)."""
    headers: dict[str, bytes] = {}
    for name, value in raw:
        if name[:len(HEADER_PREFIX)].lower() != HEADER_PREFIX:
            continue
        key = name[len(HEADER_PREFIX):].decode("latin-1").lower()
        if key in headers:
            raise HttpError(400, "bad_request", f"header RoQ-Header-{key} given twice: a message has one value "
                                                "per key")
        headers[key] = value
    return check_headers(headers) if headers else headers


def _check_text(value: str, what: str) -> None:
    """A query value that was not valid UTF-8 arrives with U+FFFD in it: refuse it rather than use
    another name than the caller sent."""
    if "\ufffd" in value:
        raise HttpError(400, "invalid_name", f"{what} must be valid UTF-8 (percent-encoded bytes were not)")


def _refuse_declared_size(request: Request, most: int) -> None:
    """A body that says it is too large is refused before it is read."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > most:
        raise HttpError(413, "too_large", f"a request body may hold at most {most} bytes here "
                                          "(web.max_body_bytes; one message without split=lines: "
                                          "exchange.max_message_bytes)")


async def _events(gateway: Gateway, subscriber: Subscriber, share: str, limit: int | None) -> AsyncIterator[str]:
    """The SSE body: events as messages come, a keepalive comment when quiet, an `error` event
    before ending on a failure. The subscriber is closed however the stream ends."""
    sent, quiet_since = 0, time.monotonic()
    tokens = TokenWriter(subscriber)
    try:
        yield "retry: 1000\n\n"
        while limit is None or sent < limit:
            if gateway.closing.is_set():  # the gateway stops: the client reconnects and resumes
                return
            want = 500 if limit is None else min(500, limit - sent)
            try:
                events = await anyio.to_thread.run_sync(next_events, subscriber, tokens, 0.5, want,
                                                        limiter=gateway.stream_threads)
            except RoqError as exc:
                yield _error_event(exc.code, str(exc))
                return
            if events:
                sent += sum(1 for e in events if e.startswith("id:"))
                quiet_since = time.monotonic()
                yield "".join(events)
            elif time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
                quiet_since = time.monotonic()
                yield ": keepalive\n\n"
    finally:
        with anyio.CancelScope(shield=True):  # the client went away: still close its subscriber
            await anyio.to_thread.run_sync(gateway.streams.close, subscriber, share)


def _error_event(code: str, message: str) -> str:
    return f"event: error\ndata: {json.dumps({'error': code, 'message': message})}\n\n"
