"""What a hostile HTTP client may cost the gateway (docs/http.md "Limits"), against a real cluster
and real `roq-web` processes: bodies counted and bounded while they are read, resume tokens bounded
by what they name, publish requests and streams bounded per caller and in all. Each refusal is a
clear 4xx/503, the gateway's memory stays bounded (its own peak RSS, the kernel's high-water mark),
and honest callers are served meanwhile."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from roq.client import Subscriber
from roq.paths import Paths
from roq.state import read_live
from roq_web.gateway import decode_token, encode_token
from tests.conftest import unavailable
from tests.support.helpers import record_figures, wait_until
from tests.support.hostile import forged_token
from tests.web.conftest import WebCluster, start_gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
T = TypeVar("T")

MIB = 1 << 20
NEWLINES = 50 * MIB  # the reported body: 50 MiB of newlines, 52 million empty lines
TOKEN_PUBLISHERS = 1_000  # what a resume token may name (docs/http.md "Limits")
# The small gateway's bounds, so that tests reach them with a few requests.
SMALL = {"max_streams": 3, "max_streams_per_client": 2, "max_publish_requests": 3,
         "max_publish_requests_per_client": 2, "max_body_bytes": MIB, "max_request_messages": 1_000,
         "publish_memory_bytes": 3 * MIB}


# ------------------------------------------------------------------ helpers

@pytest.fixture(scope="module")
def small_gateway(web_cluster: WebCluster) -> str:
    """A second gateway of the module's cluster with small bounds (auth on, the same tokens)."""
    return start_gateway(web_cluster.procs, "web-small", *(f"web.{k}={v}" for k, v in SMALL.items()))


class PeakRss:
    """The gateway process's RSS before and after a block, and its peak in between (VmHWM, reset
    through /proc/PID/clear_refs as the block starts: no spike is missed between samples)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.process = psutil.Process(pid)

    def __enter__(self) -> PeakRss:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError as exc:
            unavailable(f"cannot reset the peak RSS of the gateway: {exc}", "a memory bound")
        self.before = self.process.memory_info().rss
        return self

    def __exit__(self, *exc: object) -> None:
        status = Path(f"/proc/{self.pid}/status").read_text()
        self.peak = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))
        self.after = self.process.memory_info().rss

    def record(self, name: str) -> None:
        record_figures(name, rss_before_mb=round(self.before / MIB), peak_rss_mb=round(self.peak / MIB),
                       rss_after_mb=round(self.after / MIB))

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.before) / MIB


def gateway_pid(web: WebCluster, name: str = "web") -> int:
    return web.procs.procs[name].pid


def make_queue(web: WebCluster, name: str) -> None:
    paths = Paths(web.config.zk.root)
    if read_live(web.zk, paths, name):
        return
    answer = httpx.post(web.url + "/api/queues", json={"name": name}, headers=web.headers(web.admin_token),
                        timeout=30)
    assert answer.status_code == 201, answer.text
    wait_until(lambda: read_live(web.zk, paths, name), timeout=20, message=f"{name} running")


def publish(web: WebCluster, queue: str, lines: list[str], url: str | None = None,
            token: str | None = None) -> httpx.Response:
    return httpx.post(f"{url or web.url}/api/queues/{queue}/messages", params={"topic": "t", "split": "lines"},
                      content="".join(f"{line}\n" for line in lines).encode(), headers=web.headers(token), timeout=60)


class HeldPublish:
    """A publish request whose chunked body is still coming: it holds what the gateway gave it until
    `finish()` sends the last chunk; `answer()` reads what the gateway said, early or not."""

    def __init__(self, url: str, queue: str, token: str, split: bool = True) -> None:
        where = urlsplit(url)
        self.conn = http.client.HTTPConnection(where.hostname, where.port, timeout=20)
        self.conn.putrequest("POST", f"/api/queues/{queue}/messages?topic=t" + ("&split=lines" if split else ""))
        self.conn.putheader("Authorization", f"Bearer {token}")
        self.conn.putheader("Transfer-Encoding", "chunked")
        self.conn.endheaders()

    def send(self, data: bytes) -> None:
        self.conn.send(b"%x\r\n%s\r\n" % (len(data), data))

    def finish(self) -> tuple[int, dict[str, Any]]:
        self.conn.send(b"0\r\n\r\n")
        return self.answer()

    def answer(self) -> tuple[int, dict[str, Any]]:
        response = self.conn.getresponse()
        body = json.loads(response.read() or b"{}")
        body["retry_after"] = response.getheader("Retry-After")
        return response.status, body

    def close(self) -> None:
        self.conn.close()


def at_once(copies: int, call: Callable[[], T]) -> list[T]:
    """What `call` returned, made by `copies` threads at once."""
    results: list[T] = []
    threads = [threading.Thread(target=lambda: results.append(call())) for _ in range(copies)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


def refused(answer: httpx.Response, status: int, code: str) -> str:
    """The refusal's message, once its status, code and Retry-After (for 429, 503) are as expected."""
    assert answer.status_code == status, answer.text if answer.is_stream_consumed else "an open stream"
    body = answer.json()
    assert body["error"] == code and body["message"], body
    if status in (429, 503):
        assert answer.headers.get("Retry-After") == "1"
    return str(body["message"])


@contextlib.contextmanager
def open_stream(url: str, queue: str, token: str, **params: Any) -> Iterator[httpx.Response]:
    headers = {"Authorization": f"Bearer {token}"}
    if "last_event_id" in params:
        headers["Last-Event-ID"] = params.pop("last_event_id")
    with httpx.stream("GET", f"{url}/api/queues/{queue}/stream", params=params, headers=headers,
                      timeout=httpx.Timeout(30, read=20)) as response:
        if response.status_code != 200:
            response.read()
        yield response


def message_events(response: httpx.Response, count: int) -> list[dict[str, str]]:
    events: list[dict[str, str]] = []
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if event.get("event") == "message":
                events.append(event)
                if len(events) >= count:
                    return events
            event = {}
            continue
        field, _, value = line.partition(": ")
        event[field] = value
    return events


class HonestTraffic:
    """An honest caller publishing and reading its own messages meanwhile (on the default gateway):
    each of its publishes must be confirmed and delivered once."""

    def __init__(self, web: WebCluster, queue: str) -> None:
        self.web, self.queue = web, queue
        self.sent: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="honest-publisher")
        self.subscriber = Subscriber(queue, web.config)

    def __enter__(self) -> HonestTraffic:
        self.subscriber.wait_connected()
        self._thread.start()
        return self

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set() or n == 0:
            lines = [f"honest-{n}-{i}" for i in range(10)]
            answer = publish(self.web, self.queue, lines)
            if answer.status_code == 200:
                self.sent += lines
            else:
                self.failures.append(answer.text)
            n += 1

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        try:
            got: list[str] = []
            want = set(self.sent)

            def delivered() -> bool:
                msg = self.subscriber.receive(timeout=0.2)
                if msg is not None:
                    got.append(msg.payload.decode())
                return want <= set(got)
            wait_until(delivered, timeout=20, message="the honest messages delivered")
            assert not self.failures, self.failures[:3]
            assert self.sent and len(got) == len(set(got))
        finally:
            self.subscriber.close()


# ------------------------------------------------------------------ bodies

def test_a_body_of_50_mib_of_newlines_is_refused_before_it_is_split(web_cluster: WebCluster) -> None:
    """Before: the body was split whole, 52 million lines, the gateway's peak RSS grew by 850 MB."""
    web = web_cluster
    make_queue(web, "lines-q")
    with HonestTraffic(web, "lines-q"), PeakRss(gateway_pid(web)) as rss:
        answer = httpx.post(web.url + "/api/queues/lines-q/messages", params={"topic": "t", "split": "lines"},
                            content=b"\n" * NEWLINES, headers=web.headers(), timeout=120)
    rss.record("gateway, one body of 50 MiB of newlines")
    assert rss.growth_mb < 64, f"the gateway's peak RSS grew by {rss.growth_mb:.0f} MB"
    assert "web.max_request_messages=50000" in refused(answer, 413, "too_large")


def test_three_such_bodies_at_once_keep_the_gateway_small_and_serving(web_cluster: WebCluster) -> None:
    """Before: three at once took the gateway's peak RSS up by 1.36 GB."""
    web = web_cluster
    make_queue(web, "lines-q")

    def hostile() -> httpx.Response:
        return httpx.post(web.url + "/api/queues/lines-q/messages", params={"topic": "t", "split": "lines"},
                          content=b"\n" * NEWLINES, headers=web.headers(), timeout=120)

    with HonestTraffic(web, "lines-q"), PeakRss(gateway_pid(web)) as rss:
        answers = at_once(3, hostile)
    rss.record("gateway, three bodies of 50 MiB of newlines at once")
    assert rss.growth_mb < 64, f"the gateway's peak RSS grew by {rss.growth_mb:.0f} MB"
    assert len(answers) == 3
    for answer in answers:
        refused(answer, 413, "too_large")


def test_too_many_lines_are_refused_as_they_arrive_not_once_the_body_ends(web_cluster: WebCluster) -> None:
    """The count is made in the bytes as they come: the answer comes while the body is unfinished.
    Before: the gateway waited for the whole body."""
    web = web_cluster
    make_queue(web, "lines-q")
    held = HeldPublish(web.url, "lines-q", web.client_token)
    try:
        for _ in range(2):
            held.send(b"\n" * 40_000)  # 80,000 lines: over web.max_request_messages (50,000)
        status, body = held.answer()  # no last chunk was sent: the body never ended
    finally:
        held.close()
    assert status == 413 and body["error"] == "too_large", body
    assert publish(web, "lines-q", ["after"]).status_code == 200


def test_a_body_without_split_over_one_message_is_refused_as_it_arrives(web_cluster: WebCluster) -> None:
    """Without split=lines the body is one message: refused once it passes exchange.max_message_bytes
    (1 MiB), not after 64 MiB were read. Before: the gateway waited for the whole body."""
    web = web_cluster
    make_queue(web, "lines-q")
    held = HeldPublish(web.url, "lines-q", web.client_token, split=False)
    try:
        for _ in range(3):
            held.send(b"x" * 512 * 1024)  # 1.5 MiB, and the body goes on
        status, body = held.answer()
    finally:
        held.close()
    assert status == 413 and body["error"] == "too_large" and "exchange.max_message_bytes" in body["message"], body
    too_long = httpx.post(web.url + "/api/queues/lines-q/messages", params={"topic": "t"}, content=b"x" * (2 * MIB),
                          headers=web.headers(), timeout=30)
    refused(too_long, 413, "too_large")  # declared by Content-Length: refused before a byte is read


def test_a_body_over_web_max_body_bytes_is_refused(web_cluster: WebCluster, small_gateway: str) -> None:
    web = web_cluster
    make_queue(web, "lines-q")
    held = HeldPublish(small_gateway, "lines-q", web.client_token)
    try:
        for _ in range(3):
            held.send(b"0123456789abcde\n" * 32_000)  # 512,000 bytes of 32,000 lines... over 1,000 lines
        status, body = held.answer()
    finally:
        held.close()
    assert status == 413 and "web.max_request_messages=1000" in body["message"], body
    held = HeldPublish(small_gateway, "lines-q", web.client_token)
    try:
        for _ in range(3):
            held.send(b"x" * 511 * 1024 + b"\n")  # 3 lines of 511 KiB: over web.max_body_bytes (1 MiB)
        status, body = held.answer()
    finally:
        held.close()
    assert status == 413 and "web.max_body_bytes=1048576" in body["message"], body
    assert publish(web, "lines-q", ["fine"] * 1_000, url=small_gateway).json()["count"] == 1_000


# ------------------------------------------------------------------ resume tokens

def test_a_token_naming_72000_made_up_publishers_is_refused_and_costs_nothing(web_cluster: WebCluster) -> None:
    """The reported token: 262K characters, 72,000 publishers. Before: accepted, and each stream
    resumed with it held them all (60-100 MB each)."""
    web = web_cluster
    make_queue(web, "token-q")
    token = forged_token(72_000)
    assert len(token) <= 256 << 10  # it is under the size bound: only its count can refuse it

    def resume() -> httpx.Response:
        with open_stream(web.url, "token-q", web.client_token, last_event_id=token, limit=1) as response:
            return response

    with PeakRss(gateway_pid(web)) as rss:
        answers = at_once(4, resume)
    rss.record("gateway, four streams resumed with a token of 72,000 made-up publishers")
    assert rss.growth_mb < 64, f"the gateway's peak RSS grew by {rss.growth_mb:.0f} MB"
    assert len(answers) == 4
    for answer in answers:
        assert f"at most {TOKEN_PUBLISHERS} publishers" in refused(answer, 400, "bad_position")
    with open_stream(web.url, "token-q", web.client_token, limit=1, **{"from": "beginning"}) as honest:
        assert honest.status_code == 200
        assert publish(web, "token-q", ["still served"]).status_code == 200
        assert "still served" in message_events(honest, 1)[0]["data"]


@pytest.mark.parametrize("token, why", [
    (forged_token(1_001), "1001 exceeds"),  # one publisher more than a token may name
    (forged_token(11, runs=1_000), "more than 10000 runs"),  # 11,000 runs
    (encode_token({"version": 1, "publishers": {"made-up": {"floor": 0, "runs": []}}, "streams": {},
                   "start_at_sync": []}), "no publisher id"),  # no exchange accepts such an id
])
def test_a_token_naming_more_than_a_stream_could_have_seen_is_refused(web_cluster: WebCluster, token: str,
                                                                      why: str) -> None:
    web = web_cluster
    make_queue(web, "token-q")
    with open_stream(web.url, "token-q", web.client_token, last_event_id=token, limit=1) as response:
        assert why in refused(response, 400, "bad_position")


def test_ids_a_stream_writes_never_name_more_than_a_token_may(web_cluster: WebCluster) -> None:
    """A stream resumed with a token at the bound, then seeing one publisher more (the gateway's own):
    its event ids keep the most recently seen publishers, within the bound, and resume.
    Before: they named every publisher ever seen."""
    web = web_cluster
    make_queue(web, "cap-q")
    token = forged_token(TOKEN_PUBLISHERS)
    with open_stream(web.url, "cap-q", web.client_token, last_event_id=token, limit=40) as stream:
        assert stream.status_code == 200, stream.text
        first = publish(web, "cap-q", [f"m{i}" for i in range(40)]).json()
        events = message_events(stream, 40)
    assert len(events) == 40
    for event in (events[0], events[-1]):  # a full position, then one with a delta
        named = decode_token(event["id"])["publishers"]
        assert len(named) <= TOKEN_PUBLISHERS + 32  # + what a delta added since its base
        assert first["publisher"] in named  # the real one, most recently seen, is kept
    base = decode_token(events[0]["id"])["publishers"]
    assert len(base) == TOKEN_PUBLISHERS and "p-" + "0" * 24 not in base  # the least recently seen went
    with open_stream(web.url, "cap-q", web.client_token, last_event_id=events[-1]["id"], limit=1) as resumed:
        assert resumed.status_code == 200, resumed.text
        publish(web, "cap-q", ["next"])
        assert '"payload":"next"' in message_events(resumed, 1)[0]["data"]


# ------------------------------------------------------------------ concurrency

def test_streams_are_bounded_per_caller_and_in_all(web_cluster: WebCluster, small_gateway: str) -> None:
    web = web_cluster
    make_queue(web, "streams-q")
    with contextlib.ExitStack() as open_now:
        start = {"from": "beginning"}  # the only message of this queue is the one published below
        mine = [open_now.enter_context(open_stream(small_gateway, "streams-q", web.client_token, **start))
                for _ in range(2)]
        assert [s.status_code for s in mine] == [200, 200]
        with open_stream(small_gateway, "streams-q", web.client_token) as third:
            assert "web.max_streams_per_client=2" in refused(third, 429, "too_many_requests")
        other = open_now.enter_context(open_stream(small_gateway, "streams-q", web.admin_token, **start))
        assert other.status_code == 200  # another caller is served
        with open_stream(small_gateway, "streams-q", web.admin_token) as over:
            assert "web.max_streams=3" in refused(over, 503, "too_many_streams")
        publish(web, "streams-q", ["to all three"], url=small_gateway)
        for stream in (*mine, other):
            assert "to all three" in message_events(stream, 1)[0]["data"]
    # Their clients went away: the gateway gives their slots back.
    def opens() -> bool:
        with open_stream(small_gateway, "streams-q", web.client_token) as again:
            return again.status_code == 200
    wait_until(opens, timeout=20, message="a stream slot given back")


def test_publish_requests_are_bounded_per_caller_and_in_all(web_cluster: WebCluster, small_gateway: str) -> None:
    web = web_cluster
    make_queue(web, "publish-q")
    held: list[HeldPublish] = []
    try:
        for _ in range(2):
            held.append(HeldPublish(small_gateway, "publish-q", web.client_token))
            held[-1].send(b"held\n")

        def third_refused() -> str | None:  # once the gateway took both, the caller's third is refused
            answer = publish(web, "publish-q", ["probe"], url=small_gateway)
            return answer.text if answer.status_code == 429 else None
        message = wait_until(third_refused, timeout=20, message="the caller's share taken")
        assert "web.max_publish_requests_per_client=2" in message
        assert publish(web, "publish-q", ["other caller"], url=small_gateway, token=web.admin_token).status_code == 200
        held.append(HeldPublish(small_gateway, "publish-q", web.admin_token))
        held[-1].send(b"held\n")

        def all_taken() -> httpx.Response | None:
            answer = publish(web, "publish-q", ["probe"], url=small_gateway, token=web.admin_token)
            return answer if answer.status_code == 503 else None
        assert "web.max_publish_requests=3" in refused(wait_until(all_taken, timeout=20, message="all taken"),
                                                       503, "busy")
        answers = [h.finish() for h in held]
        assert [status for status, _ in answers] == [200, 200, 200] and all(a["count"] == 1 for _, a in answers)
    finally:
        for h in held:
            h.close()
    assert publish(web, "publish-q", ["after"], url=small_gateway).status_code == 200


def test_the_bodies_in_flight_share_one_memory_budget(web_cluster: WebCluster, small_gateway: str) -> None:
    """web.publish_memory_bytes (3 MiB here): a body counts twice as it is read; a request that
    would pass the budget is refused 503 while the others go on."""
    web = web_cluster
    make_queue(web, "publish-q")
    first = HeldPublish(small_gateway, "publish-q", web.client_token)
    try:
        for _ in range(7):
            first.send(b"y" * (128 << 10) + b"\n")  # 7 lines, 0.88 MiB: 1.75 MiB reserved

        def refused_for_memory() -> httpx.Response | None:
            answer = publish(web, "publish-q", ["z" * (128 << 10)] * 7, url=small_gateway, token=web.admin_token)
            return answer if answer.status_code == 503 else None
        answer = wait_until(refused_for_memory, timeout=20, message="the budget taken")
        assert "web.publish_memory_bytes=3145728" in refused(answer, 503, "busy")
        assert publish(web, "publish-q", ["small"], url=small_gateway, token=web.admin_token).status_code == 200
        status, body = first.finish()
        assert status == 200 and body["count"] == 7, body
    finally:
        first.close()
    ok = publish(web, "publish-q", ["z" * (128 << 10)] * 7, url=small_gateway, token=web.admin_token)
    assert ok.status_code == 200, ok.text  # the budget was given back


def test_without_auth_each_address_has_its_own_share(web_cluster: WebCluster) -> None:
    web = web_cluster
    make_queue(web, "streams-q")
    url = start_gateway(web.procs, "web-open", "web.auth=false", "web.max_streams_per_client=1")
    port = urlsplit(url).port
    other_address = httpx.HTTPTransport(local_address="127.0.0.2")
    with open_stream(url, "streams-q", "unused") as first:
        assert first.status_code == 200
        with open_stream(url, "streams-q", "unused") as second:
            assert "address 127.0.0.1" in refused(second, 429, "too_many_requests")
        with httpx.Client(transport=other_address, timeout=httpx.Timeout(30, read=20)) as client, \
                client.stream("GET", f"http://127.0.0.1:{port}/api/queues/streams-q/stream") as elsewhere:
            assert elsewhere.status_code == 200
