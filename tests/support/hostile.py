"""Hostile peers, as the chaos run (scripts/chaos.py), the measurements (scripts/gateway_limits.py)
and the tests play them: raw ZeroMQ and HTTP clients that send what an attacker would, written
from the wire formats (docs/protocol.md, docs/http.md), never through the client library.

Each returns what it saw, so its caller can say what the attack achieved (nothing, we hope).
"""

from __future__ import annotations

import base64
import os
import threading
import time
import zlib
from collections import Counter
from typing import Any

import msgpack
import zmq

from roq import protocol
from roq.config import Config
from roq.security import secure_client

NEWLINE_BODY_BYTES = 50 << 20  # a body of newlines this big once took the gateway to 537 MB


def dealer(endpoint: str, config: Config | None = None, send_timeout_ms: int = 3000) -> zmq.Socket:
    """A raw DEALER to `endpoint` (a CURVE client when the cluster runs CURVE)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = send_timeout_ms  # a frozen server never takes the frames: give up, do not hang
    if config is not None:
        secure_client(sock, config)
    sock.connect(endpoint)
    return sock


# ---------------------------------------------------------------- a replica's sockets (protocol 6)


def forged_copy_frames(exchange: str, incarnation: str, next_pos: int, publisher: str) -> list[list[Any]]:
    """Every frame the replica attacks try on a replica's `repl`, as raw msgpack lists: a follow of the
    running incarnation and a copy jumping ahead, in the layout without a proof and with a made-up
    one; a copy rewriting the stream from position 1; forged group state and acks; an adoption
    request. Their deliveries carry `publisher`'s id (the victim's)."""
    def deliveries(first: int) -> list[list[Any]]:
        return [[b"load", protocol.encode_delivery(exchange, incarnation, first + i, [], publisher, 0, [i + 1],
                                                   [b"forged"]), 1] for i in range(5)]
    wrong = os.urandom(32)
    record = ["g", [b"load"], 30_000, 5, b"dead", next_pos, []]
    return [
        ["follow", protocol.DATA_VERSION, incarnation, exchange],  # the layout before proofs
        ["copy", protocol.DATA_VERSION, incarnation, next_pos + 3, deliveries(next_pos + 3), True],
        ["groups", protocol.DATA_VERSION, incarnation, [record]],
        ["follow", protocol.DATA_VERSION, incarnation, exchange, wrong],
        ["copy", protocol.DATA_VERSION, incarnation, next_pos + 3, deliveries(next_pos + 3), True, wrong],
        ["copy", protocol.DATA_VERSION, incarnation, 1, deliveries(1), True, wrong],
        ["groups", protocol.DATA_VERSION, incarnation, [record], wrong],
        ["done", protocol.DATA_VERSION, incarnation, [["g", [[1, 0, 1_000_000]]]], wrong],
        ["adopt", protocol.DATA_VERSION, f"{exchange}.ffffffff", exchange, wrong],
    ]


def attack_replica_copy(endpoint: str, frames: list[list[Any]], config: Config | None = None,
                        wait_ms: int = 1000) -> bool:
    """Send `frames` to a replica's `repl`; True if any was answered (none may be)."""
    sock = dealer(endpoint, config)
    try:
        for frame in frames:
            sock.send(msgpack.packb(frame, use_bin_type=True))
        return bool(sock.poll(wait_ms))
    finally:
        sock.close()


def ask_seals(endpoint: str, incarnation: str, count: int, config: Config | None = None) -> Counter[str]:
    """`count` position requests naming `incarnation` at a replica's `replay`: how each was answered
    ("sealed" for a position, else the refusal's code, or "no answer")."""
    answers: Counter[str] = Counter()
    sock = dealer(endpoint, config)
    try:
        for rid in range(1, count + 1):
            sock.send(protocol.encode_position_request(rid, [b"load"], incarnation))
            if not sock.poll(3000):
                answers["no answer"] += 1
                continue
            try:
                protocol.decode_replay_reply(sock.recv(), 1 << 30)
                answers["sealed"] += 1
            except protocol.ReplayRefused as refused:
                answers[refused.refusal] += 1
    finally:
        sock.close()
    return answers


# ---------------------------------------------------------------- a consumer group's work socket (protocol 7)


def hostile_member(endpoints: list[str], join: bytes, seconds: float, config: Config | None = None,
                   stop: threading.Event | None = None) -> Counter[str]:
    """A member on every `work` endpoint that joins with `join` (send the group's own settings and
    a huge prefetch), then for `seconds` nacks with requeue everything it is handed, acks ranges it
    does not hold, and finally drops its connections. Counts what it saw and did."""
    seen: Counter[str] = Counter()
    socks = [dealer(endpoint, config) for endpoint in endpoints]
    poller = zmq.Poller()
    try:
        for sock in socks:
            sock.send(join)
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            for sock, _ in poller.poll(100):
                _answer_work(sock, seen)
    finally:
        for sock in socks:
            sock.close()
    return seen


def _answer_work(sock: zmq.Socket, seen: Counter[str]) -> None:
    try:
        reply = protocol.decode_work_reply(sock.recv(), 1 << 30)
    except protocol.ProtocolError:
        seen["bad replies"] += 1
        return
    seen[reply.kind] += 1
    if reply.kind != "work" or not reply.entries or reply.group is None:
        return
    held = [[e[0], e[1], len(e[6])] for e in reply.entries]
    seen["messages taken"] += sum(r[2] for r in held)
    sock.send(protocol.encode_settle(protocol.NACK, reply.group, reply.incarnation, held, requeue=True))
    sock.send(protocol.encode_settle(protocol.ACK, reply.group, reply.incarnation, [[1, 0, 1_000_000]]))


# ---------------------------------------------------------------- the HTTP gateway (docs/http.md)


def forged_token(publishers: int, runs: int = 0) -> str:
    """A resume token that decodes: `publishers` made-up publishers of the right form, each with
    `runs` runs of sequence numbers seen, compressed as hard as zlib can (72,000 publishers with
    nothing seen fit in 262K characters)."""
    seen = {"floor": 0, "runs": [[2 * i + 1, 2 * i + 1] for i in range(runs)]}
    position = {"version": 1, "publishers": {f"p-{i:024x}": seen for i in range(publishers)},
                "streams": {}, "start_at_sync": []}
    packed = zlib.compress(msgpack.packb(position, use_bin_type=True), 9)
    return "r1." + base64.urlsafe_b64encode(packed).rstrip(b"=").decode()


def post_newlines(url: str, queue: str, copies: int, body_bytes: int = NEWLINE_BODY_BYTES) -> list[str]:
    """`copies` concurrent `POST ?split=lines` of `body_bytes` newlines: each answer's status and text."""
    import httpx

    statuses: list[str] = []

    def one() -> None:
        try:
            answer = httpx.post(f"{url}/api/queues/{queue}/messages", params={"topic": "t", "split": "lines"},
                                content=b"\n" * body_bytes, timeout=120)
            statuses.append(f"{answer.status_code} {answer.text[:100]}")
        except httpx.HTTPError as exc:
            statuses.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one) for _ in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def open_stream_with_token(url: str, queue: str, token: str, read_seconds: float = 2.0) -> str:
    """An SSE stream resumed with `token`: its status, and how many message events came in a while."""
    import httpx

    got = 0
    try:
        with httpx.stream("GET", f"{url}/api/queues/{queue}/stream", headers={"Last-Event-ID": token},
                          timeout=httpx.Timeout(30, read=read_seconds)) as response:
            if response.status_code != 200:
                return f"{response.status_code} {response.read().decode()[:100]}"
            deadline = time.monotonic() + read_seconds
            for line in response.iter_lines():
                got += line == "event: message"
                if time.monotonic() > deadline:
                    break
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__} after {got} messages"
    return f"200, {got} messages"
