"""The web console and HTTP API (docs/http.md): a FastAPI application over one RoQ client.

Reads are served from the sampler's latest view of the cluster (roq_web/history.py); admin actions
go to the leader through `Admin`, with the gateway's own identity (`security.identity`), once
the caller showed an admin credential (roq_web/auth.py); publishing and streaming go through
roq_web/gateway.py, within the bounds of roq_web/limits.py (per caller and in all: slots, a memory budget,
bodies counted as they arrive). Errors are JSON, `{"error": code, "message": text}`, the codes of
the control API (docs/protocol.md), with the HTTP status that fits.

This module builds the application; the routes are by purpose: who is calling and the session
(access.py), reads (read_routes.py), admin actions (admin_routes.py), publish and stream
(data_routes.py).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from roq import __version__
from roq.client.admin import Admin
from roq.client.metadata import MetadataClient
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
from roq_web.access import HttpError, error_response, install_session_routes
from roq_web.admin_routes import install_admin_routes, install_command_routes, install_permission_routes
from roq_web.auth import Guard
from roq_web.data_routes import install_data_routes
from roq_web.gateway import Publishers, Streams
from roq_web.history import Sampler
from roq_web.limits import CallerLimitError, Limits
from roq_web.read_routes import install_read_routes

STATIC = Path(__file__).parent / "static"
# Swagger UI 5 (it renders OpenAPI 3.1, which FastAPI writes; 4.x cannot), as fastapi-offline ships it.
SWAGGER_UI = Path(fastapi_offline.__file__).parent / "static"
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


# ------------------------------------------------------------------ the application

class Gateway:
    """Everything the routes share: one metadata conversation with the GCMs (no ZooKeeper), the
    admin client, the data path."""

    def __init__(self, config: Config, metadata: MetadataClient | None = None) -> None:
        self.config = config
        self.guard = Guard(config.web.auth, config.web.tokens_file, config.web.session_seconds)
        self._own_metadata = metadata is None
        self.metadata = metadata or MetadataClient(config)  # one conversation with the GCMs for every route
        self.admin = Admin(config)
        self.sampler = Sampler(self.admin, config.web.sample_interval, config.web.history_seconds)
        self.publishers = Publishers(config, self.metadata)
        self.limits = Limits(config.web, config.exchange.max_message_bytes, config.client.max_unconfirmed)
        self.streams = Streams(config, self.metadata)
        # Threads for blocking subscriber reads, apart from the pool the other routes use.
        self.stream_threads = anyio.CapacityLimiter(config.web.max_streams + 4)
        self.closing = threading.Event()  # set first when the gateway stops: open streams end

    def start(self) -> None:
        self.sampler.start()

    def close(self) -> None:
        self.sampler.stop()
        self.publishers.close()
        self.admin.close()
        if self._own_metadata:
            self.metadata.close()


def create_app(config: Config, metadata: MetadataClient | None = None) -> FastAPI:
    gateway = Gateway(config, metadata)

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
    install_session_routes(app, gateway)
    install_read_routes(app, gateway)
    install_admin_routes(app, gateway)
    install_command_routes(app, gateway)
    install_permission_routes(app, gateway)
    install_data_routes(app, gateway)
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


