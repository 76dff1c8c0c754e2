"""Publishing and streaming over HTTP: bodies bounded as they arrive (roq_web/limits.py), publishes
answered after the confirm, streams as server-sent events that resume from a token
(roq_web/gateway.py)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from fastapi import FastAPI, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from roq.client import Subscriber
from roq.client.envelope import decode_envelope
from roq.errors import (
    RoqError,
)
from roq.names import check_queue_name, check_topic
from roq.protocol import check_headers
from roq.start_time import EXAMPLE, parse_start_time
from roq_web.access import Caller, HttpError, check_text, share_of
from roq_web.gateway import TokenWriter, next_events
from roq_web.limits import read_envelope, read_messages

if TYPE_CHECKING:
    from roq_web.app import Gateway

KEEPALIVE_SECONDS = 15.0  # a comment line on an idle stream this often keeps proxies from closing it


# ------------------------------------------------------------------ publish and stream

def install_data_routes(app: FastAPI, gateway: Gateway) -> None:
    @app.post("/api/queues/{queue}/messages", tags=["data"],
              summary="Publish the body as one message (or one per line, or a JSON envelope), answered after the "
                      "confirm",
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
    async def publish(request: Request, who: Caller, queue: str, topic: str,
                      split: Annotated[str | None, Query(pattern="^lines$")] = None,
                      envelope: Annotated[str | None, Query(pattern="^json$")] = None,
                      idempotency_key: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        check_text(topic, "topic")
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
             summary="Server-Sent Events: the queue's messages from now, the beginning or a time, resumable with "
                     "Last-Event-ID",
             responses={200: {"content": {"text/event-stream": {}}}})
    async def stream(request: Request, who: Caller, queue: str, topic: Annotated[list[str] | None, Query()] = None,
                     start: Annotated[str, Query(alias="from", max_length=64)] = "now",
                     position: str | None = None, limit: Annotated[int | None, Query(ge=1)] = None,
                     last_event_id: Annotated[str | None, Header()] = None) -> StreamingResponse:
        token = last_event_id or position
        for t in topic or []:
            check_text(t, "topic")
        begin = stream_start(start)
        share = share_of(request, who)
        subscriber = await run_in_threadpool(gateway.streams.open, queue, topic or [], begin, token, share)
        return StreamingResponse(_events(gateway, subscriber, share, limit), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def stream_start(text: str) -> str | datetime:
    """`from=`: now, beginning, or a time (ISO 8601 with a zone, or epoch milliseconds): 400 otherwise."""
    if text in ("now", "beginning"):
        return text
    try:
        return datetime.fromtimestamp(parse_start_time(text), UTC)
    except (ValueError, OverflowError, OSError) as exc:
        raise HttpError(400, "bad_request", f"from must be now, beginning or a time ({EXAMPLE}): {exc}") from None


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

