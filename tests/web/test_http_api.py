"""The HTTP API against a real cluster and a real `roq-web` process (tests/web/conftest.py):
credentials and CSRF, publish answered after the confirm, SSE streams that resume exactly from
any event's id (also on another gateway), idempotent retries, confirmed HTTP publishes surviving
an exchange crash, and bad input refused without harm."""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roq.client import Subscriber
from roq.client.admin import Admin
from roq.paths import Paths
from roq.state import read_live
from tests.profiles import examples
from tests.support.helpers import wait_until
from tests.web.conftest import WebCluster, start_gateway

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


# ------------------------------------------------------------------ helpers

def api(web: WebCluster, method: str, path: str, token: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = kwargs.pop("headers", {})
    if token != "":
        headers = {**web.headers(token), **headers}
    return httpx.request(method, web.url + path, headers=headers, timeout=30, **kwargs)


def make_queue(web: WebCluster, name: str, exchanges: int = 1) -> None:
    answer = api(web, "POST", "/api/queues", web.admin_token, json={"name": name, "exchanges": exchanges})
    assert answer.status_code == 201, answer.text
    paths = Paths(web.config.zk.root)
    wait_until(lambda: len(read_live(web.zk, paths, name)) == exchanges, timeout=20, message="exchanges live")


def publish_lines(web: WebCluster, queue: str, topic: str, lines: list[str], **headers: str) -> dict[str, Any]:
    answer = api(web, "POST", f"/api/queues/{queue}/messages", params={"topic": topic, "split": "lines"},
                 content="".join(f"{line}\n" for line in lines).encode(), headers=headers)
    assert answer.status_code == 200, answer.text
    return answer.json()


def sse_events(web: WebCluster, queue: str, count: int, url: str | None = None,
               **params: Any) -> Iterator[dict[str, Any]]:
    """Up to `count` events of a stream (each {"id", "event", "data"}), then the connection is
    dropped, as a client going away would."""
    headers = web.headers()
    if "last_event_id" in params:
        headers["Last-Event-ID"] = params.pop("last_event_id")
    with httpx.stream("GET", (url or web.url) + f"/api/queues/{queue}/stream", params=params, headers=headers,
                      timeout=httpx.Timeout(30, read=20)) as response:
        assert response.status_code == 200, response.read().decode()
        got, event = 0, {}
        for line in response.iter_lines():
            if not line:
                if "data" in event:
                    yield event
                    got += 1
                    if got >= count:
                        return
                event = {}
                continue
            field, _, value = line.partition(": ")
            if field in ("id", "event", "data"):
                event[field] = value


def payloads_of(events: list[dict[str, Any]]) -> list[str]:
    return [json.loads(e["data"])["payload"] for e in events]


# ------------------------------------------------------------------ credentials and CSRF

def test_reads_need_a_token_and_changes_need_the_admin_role(web_cluster: WebCluster) -> None:
    web = web_cluster
    refused = api(web, "GET", "/api/cluster", token="")
    assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
    assert api(web, "GET", "/api/cluster", token="roq_not-a-token").status_code == 401
    cluster = api(web, "GET", "/api/cluster")
    assert cluster.status_code == 200 and cluster.json()["leader"]["id"]
    forbidden = api(web, "POST", "/api/queues", json={"name": "by-client"})
    assert forbidden.status_code == 403 and "admin role" in forbidden.json()["message"]
    with Admin(web.config) as admin:
        assert "by-client" not in [q["name"] for q in admin.list_queues()]
    make_queue(web, "by-admin")
    assert api(web, "DELETE", "/api/queues/by-admin").status_code == 403
    assert api(web, "DELETE", "/api/queues/by-admin", web.admin_token).json() == {"deleted": "by-admin"}


def test_a_console_session_is_an_httponly_cookie_and_its_changes_need_the_csrf_token(web_cluster: WebCluster) -> None:
    web = web_cluster
    with httpx.Client(base_url=web.url, timeout=30) as browser:
        assert browser.post("/api/session", json={"token": "roq_wrong"}).status_code == 401
        login = browser.post("/api/session", json={"token": web.admin_token})
        assert login.status_code == 200, login.text
        cookie = login.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert web.admin_token not in login.text  # the token never comes back
        csrf = login.json()["csrf"]
        assert browser.get("/api/session").json()["role"] == "admin"
        without = browser.post("/api/queues", json={"name": "csrf-q"})
        assert without.status_code == 403 and without.json()["error"] == "csrf"
        other_site = browser.post("/api/queues", json={"name": "csrf-q"},
                                  headers={"X-CSRF-Token": csrf, "Origin": "https://evil.example"})
        assert other_site.status_code == 403
        made = browser.post("/api/queues", json={"name": "csrf-q"}, headers={"X-CSRF-Token": csrf})
        assert made.status_code == 201, made.text
        assert browser.delete("/api/queues/csrf-q", headers={"X-CSRF-Token": csrf}).status_code == 200
        browser.delete("/api/session", headers={"X-CSRF-Token": csrf})
        assert browser.get("/api/cluster").status_code == 401


def test_permissions_are_read_and_changed_by_admin_tokens_only(web_cluster: WebCluster) -> None:
    web = web_cluster
    for method, path, body in (("GET", "/api/permissions", None), ("GET", "/api/permissions/app", None),
                               ("POST", "/api/permissions/app/grant", {"publish": ["web-*"]}),
                               ("POST", "/api/permissions/app/revoke", {"all": True}),
                               ("DELETE", "/api/permissions/app", None)):
        refused = api(web, method, path, json=body)  # the client token
        assert refused.status_code == 403 and "admin role" in refused.json()["message"], (path, refused.text)
    assert api(web, "GET", "/api/permissions", web.admin_token).json()["keys"] == []  # nothing was granted

    granted = api(web, "POST", "/api/permissions/app/grant", web.admin_token,
                  json={"publish": ["web-*"], "subscribe": ["web-orders"]})
    assert granted.status_code == 200, granted.text
    answer = granted.json()
    assert answer["entry"] == {"publish": ["web-*"], "subscribe": ["web-orders"], "consume": [], "admin": False}
    assert (answer["changed"], answer["enforced"], answer["default"]) == (True, False, "all")  # no CURVE here
    listed = api(web, "GET", "/api/permissions", web.admin_token).json()
    assert [k["name"] for k in listed["keys"]] == ["app"] and listed["version"] == answer["version"]
    for path, body, code in (("/api/permissions/app/grant", {"publish": ["web/x"]}, "invalid_name"),
                             ("/api/permissions/no%20such%20key/grant", {"publish": ["x"]}, "invalid_name"),
                             ("/api/permissions/app/grant", {"publish": "web-*"}, "bad_request"),
                             ("/api/permissions/app/revoke", {"publish": ["never-granted"]}, "bad_request")):
        bad = api(web, "POST", path, web.admin_token, json=body)
        assert bad.status_code == 400 and bad.json()["error"] == code, (path, bad.text)
    assert api(web, "GET", "/api/permissions/app", web.admin_token).json()["entry"] == answer["entry"]  # unchanged

    with httpx.Client(base_url=web.url, timeout=30) as browser:  # a console session: changes need its CSRF token
        csrf = browser.post("/api/session", json={"token": web.admin_token}).json()["csrf"]
        forged = browser.post("/api/permissions/app/grant", json={"admin": True})
        assert forged.status_code == 403 and forged.json()["error"] == "csrf"
        assert browser.post("/api/permissions/app/grant", json={"admin": True},
                            headers={"X-CSRF-Token": csrf, "Origin": "https://evil.example"}).status_code == 403
        assert not browser.get("/api/permissions/app").json()["entry"]["admin"]
    revoked = api(web, "POST", "/api/permissions/app/revoke", web.admin_token, json={"publish": ["web-*"]}).json()
    assert revoked["entry"]["publish"] == [] and revoked["entry"]["subscribe"] == ["web-orders"]
    assert api(web, "DELETE", "/api/permissions/app", web.admin_token).json()["entry"] is None
    assert api(web, "GET", "/api/permissions", web.admin_token).json()["keys"] == []


# ------------------------------------------------------------------ what the console reads

def test_every_listing_has_each_queues_replicas(web_cluster: WebCluster) -> None:
    web = web_cluster
    try:
        for name, replicas in (("one-copy", 1), ("two-copies", 2)):
            made = api(web, "POST", "/api/queues", web.admin_token, json={"name": name, "replicas": replicas})
            assert made.status_code == 201 and made.json()["replicas"] == replicas, made.text

        def listed(path: str, rows: Any) -> dict[str, Any]:
            found = {q["name"]: q["replicas"] for q in rows(api(web, "GET", path).json())}
            return found if {"one-copy", "two-copies"} <= set(found) else {}
        queues = wait_until(lambda: listed("/api/queues", lambda answer: answer), message="both queues listed")
        assert queues["one-copy"] == 1 and queues["two-copies"] == 2
        cluster = listed("/api/cluster", lambda answer: answer["queues"])
        assert cluster["one-copy"] == 1 and cluster["two-copies"] == 2
        assert api(web, "GET", "/api/queues/two-copies").json()["replicas"] == 2
    finally:  # the module's hosts have room for a few queues only
        for name in ("one-copy", "two-copies"):
            api(web, "DELETE", f"/api/queues/{name}", web.admin_token)


def test_a_gateway_shows_the_events_from_before_it_started(web_cluster: WebCluster) -> None:
    web = web_cluster
    make_queue(web, "early-q")
    with Admin(web.config) as admin:
        wait_until(lambda: any(e["detail"] == "queue early-q created" for e in admin.cluster_events()["events"]),
                   message="the leader logging the queue")
        leader = admin.status()["leader"]["id"]
    late = start_gateway(web.procs, "web-late")
    try:
        answer = httpx.get(late + "/api/cluster", headers=web.headers(), timeout=30).json()
        page = httpx.get(late + "/api/queues/early-q", headers=web.headers(), timeout=30).json()
    finally:
        web.procs.kill("web-late", signal.SIGTERM)
        web.procs.procs["web-late"].wait(timeout=15)
    kinds = {(e["kind"], e["queue"]) for e in answer["events"]}
    assert ("queue created", "early-q") in kinds  # it happened before this gateway started
    assert any(e["kind"] == "leader" and e["detail"].startswith(f"{leader} is the leader") for e in answer["events"])
    times = [e["time"] for e in answer["events"]]
    assert times == sorted(times)
    assert [e["kind"] for e in page["events"]] == ["queue created"]
    assert api(web, "DELETE", "/api/queues/early-q", web.admin_token).status_code == 200


# ------------------------------------------------------------------ consumer groups, purges, conditional changes

def group_figures(web: WebCluster, queue: str, group: str = "workers") -> tuple[int, int, int]:
    """(members, in flight, ready) of the group as GET /api/queues/{q} shows it; (-1, -1, -1) if absent."""
    rows = {g["name"]: g for g in api(web, "GET", f"/api/queues/{queue}").json()["groups"]}
    row = rows.get(group, {})
    return row.get("members", -1), row.get("in_flight", -1), row.get("ready", -1)


@contextlib.contextmanager
def busy_group(web: WebCluster, queue: str) -> Iterator[Subscriber]:
    """Queue `queue` with group "workers": one member holding 5 messages unacked, 45 ready. The queue
    is deleted at the end."""
    make_queue(web, queue)
    member = Subscriber(queue, web.config, ["jobs"], group="workers", prefetch=5, auto_ack=False)
    try:
        publish_lines(web, queue, "jobs", [f"job {i}" for i in range(50)])
        wait_until(lambda: group_figures(web, queue) == (1, 5, 45), timeout=15, message="the group's figures")
        yield member
    finally:
        member.close()
        api(web, "DELETE", f"/api/queues/{queue}", web.admin_token)


def test_a_queue_shows_its_groups_and_refuses_bad_or_unauthorised_changes(web_cluster: WebCluster) -> None:
    web, queue = web_cluster, "groups-q"
    with busy_group(web, queue):
        listed = api(web, "GET", f"/api/queues/{queue}/groups").json()
        assert [(g["name"], g["topics"], g["acked"], g["in_flight"]) for g in listed] == [("workers", ["jobs"], 0, 5)]
        shown = api(web, "GET", f"/api/queues/{queue}/groups/workers").json()
        assert (shown["queue"], shown["ready"], set(shown["by_exchange"])) == (queue, 45, {"x1"})
        for path, code in ((f"/api/queues/{queue}/groups/nobody", "group_not_found"),
                           ("/api/queues/no-such/groups", "queue_not_found")):
            missing = api(web, "GET", path)
            assert missing.status_code == 404 and missing.json()["error"] == code, missing.text

        for method, path in (("POST", f"/api/queues/{queue}/groups/workers/reset"),
                             ("DELETE", f"/api/queues/{queue}/groups/workers"), ("POST", f"/api/queues/{queue}/purge"),
                             ("DELETE", f"/api/queues/{queue}?if_empty=true")):
            refused = api(web, method, path)  # the client token
            assert refused.status_code == 403 and "admin role" in refused.json()["message"], (path, refused.text)
        for method, path, status, says in (
                ("DELETE", f"/api/queues/{queue}/groups/workers", 409, "1 members connected"),
                ("DELETE", f"/api/queues/{queue}?if_empty=true", 409, "is not empty"),
                ("DELETE", f"/api/queues/{queue}?if_unused=true", 409, "group workers has 1 members"),
                ("POST", f"/api/queues/{queue}/groups/bad%20name!/reset", 400, "invalid group name"),
                ("POST", f"/api/queues/{queue}/groups/nobody/reset", 404, "has no group 'nobody'"),
                ("POST", "/api/queues/no-such/purge", 404, "does not exist"),
                ("POST", f"/api/queues/{queue}/purge?wait=-1", 400, "wait")):
            bad = api(web, method, path, web.admin_token)
            assert bad.status_code == status and says in bad.json()["message"], (path, bad.text)
        assert group_figures(web, queue) == (1, 5, 45)  # the refusals changed nothing
        assert queue in [q["name"] for q in api(web, "GET", "/api/queues").json()]


def test_an_admin_resets_and_deletes_a_group_purges_the_queue_and_deletes_it_once_empty(
        web_cluster: WebCluster) -> None:
    web, queue = web_cluster, "purged-q"
    with busy_group(web, queue) as member:
        reset = api(web, "POST", f"/api/queues/{queue}/groups/workers/reset", web.admin_token)
        assert reset.status_code == 200, reset.text
        assert reset.json()["done"] and reset.json()["results"] == {"x1": {"dropped": 45}}
        wait_until(lambda: group_figures(web, queue) == (1, 5, 0), timeout=5, message="the reset's effect")
        status = api(web, "GET", f"/api/queues/{queue}/commands/{reset.json()['id']}").json()  # a client may read it
        assert status["op"] == "group.reset" and status["results"] == reset.json()["results"]
        for command, status_code, code in (("c-0000000000000000", 404, "command_not_found"),
                                           ("bad*id", 400, "bad_request")):
            unknown = api(web, "GET", f"/api/queues/{queue}/commands/{command}")
            assert unknown.status_code == status_code and unknown.json()["error"] == code, unknown.text

        member.close()  # its 5 go back to ready: a group without members may be deleted
        wait_until(lambda: group_figures(web, queue) == (0, 0, 5), timeout=10, message="the member gone")
        deleted = api(web, "DELETE", f"/api/queues/{queue}/groups/workers", web.admin_token)
        assert deleted.status_code == 200 and deleted.json()["results"]["x1"] == {"deleted": True, "dropped": 5}
        wait_until(lambda: api(web, "GET", f"/api/queues/{queue}").json()["groups"] == [], timeout=5,
                   message="the group gone")

        purge = api(web, "POST", f"/api/queues/{queue}/purge", web.admin_token, params={"wait": 0})
        assert purge.status_code == 202 and not purge.json()["done"], purge.text  # issued, not yet applied
        applied = wait_until(lambda: (s := api(web, "GET", f"/api/queues/{queue}/commands/{purge.json()['id']}")
                                      .json())["done"] and s, timeout=10, message="the purge applied")
        assert applied["results"]["x1"]["messages"] == 50
        emptied = api(web, "DELETE", f"/api/queues/{queue}", web.admin_token, params={"if_empty": "true"})
        assert emptied.status_code == 200 and emptied.json() == {"deleted": queue}, emptied.text
        assert queue not in [q["name"] for q in api(web, "GET", "/api/queues").json()]


def test_create_with_exist_ok_is_201_then_200_and_409_when_the_settings_differ(web_cluster: WebCluster) -> None:
    web, queue = web_cluster, "maybe-q"
    try:
        made = api(web, "POST", "/api/queues", web.admin_token, json={"name": queue, "exchanges": 2, "exist_ok": True})
        assert made.status_code == 201 and made.json()["existed"] is False, made.text
        again = api(web, "POST", "/api/queues", web.admin_token, json={"name": queue, "exchanges": 2, "exist_ok": True})
        assert again.status_code == 200 and again.json()["existed"] is True and again.json()["exchanges"] == 2
        unnamed = api(web, "POST", "/api/queues", web.admin_token, json={"name": queue, "exist_ok": True})
        assert unnamed.status_code == 200, unnamed.text  # nothing named: nothing compared
        for body, says in (({"exchanges": 3, "exist_ok": True}, "exchanges 2 (asked 3)"),
                           ({"replicas": 2, "exist_ok": True}, "replicas 1 (asked 2)"),
                           ({"exchanges": 2}, "already exists")):
            conflict = api(web, "POST", "/api/queues", web.admin_token, json={"name": queue, **body})
            assert conflict.status_code == 409 and conflict.json()["error"] == "queue_exists", conflict.text
            assert says in conflict.json()["message"], conflict.text
        for body in ({"exist_ok": "perhaps"}, {"exchanges": 0, "exist_ok": True}):
            bad = api(web, "POST", "/api/queues", web.admin_token, json={"name": "maybe-not", **body})
            assert bad.status_code == 400 and bad.json()["error"] == "bad_request", bad.text
        refused = api(web, "POST", "/api/queues", json={"name": "maybe-not", "exist_ok": True})  # the client token
        assert refused.status_code == 403
        with Admin(web.config) as admin:  # the refusals changed nothing
            assert "maybe-not" not in [q["name"] for q in admin.list_queues()]
            assert len(admin.describe_queue(queue)["exchanges"]) == 2
    finally:
        api(web, "DELETE", f"/api/queues/{queue}", web.admin_token)


# ------------------------------------------------------------------ publish and stream

def test_curl_publishes_and_streams_as_docs_http_md_shows(web_cluster: WebCluster) -> None:
    web = web_cluster
    make_queue(web, "curl-q")
    auth = f"Authorization: Bearer {web.client_token}"
    published = subprocess.run(
        ["curl", "-sS", "--fail-with-body", "-H", auth, "--data-binary", "hello from curl",
         f"{web.url}/api/queues/curl-q/messages?topic=greetings"], capture_output=True, text=True, timeout=30)
    assert published.returncode == 0, published.stdout + published.stderr
    assert json.loads(published.stdout)["count"] == 1
    streamed = subprocess.run(
        ["curl", "-sS", "-N", "-H", auth, f"{web.url}/api/queues/curl-q/stream?topic=greetings&from=beginning&limit=1"],
        capture_output=True, text=True, timeout=30)
    assert streamed.returncode == 0, streamed.stderr
    data = [line[6:] for line in streamed.stdout.splitlines() if line.startswith("data: ")]
    assert [json.loads(d)["payload"] for d in data] == ["hello from curl"]


def test_headers_travel_through_http_both_ways(web_cluster: WebCluster) -> None:
    """Request headers `RoQ-Header-*` and the JSON envelope publish headers; SSE events carry them
    as a native subscriber's messages do, with the payload's encoding rules, and the publisher's time."""
    web = web_cluster
    make_queue(web, "headers-q")
    sent = publish_lines(web, "headers-q", "h", ["one", "two"], **{"RoQ-Header-Trace-Id": "4bf9", "roq-header-n": "1"})
    envelope = [{"payload": "three\nlines", "headers": {"Trace-Id": "e1"}},
                {"payload": base64.b64encode(b"\xff\x00").decode(), "encoding": "base64",
                 "headers": {"raw": base64.b64encode(b"\xfe").decode()}, "headers_encoding": "base64"},
                {"payload": "plain"}]
    answer = api(web, "POST", "/api/queues/headers-q/messages", params={"topic": "h", "envelope": "json"},
                 content=json.dumps(envelope).encode(), headers={"RoQ-Header-From": "gateway"})
    assert answer.status_code == 200 and answer.json()["count"] == 3, answer.text
    events = [json.loads(e["data"]) for e in sse_events(web, "headers-q", 5, topic="h", **{"from": "beginning"})]
    assert [(e["payload"], e["encoding"], e["headers"], e["headers_encoding"]) for e in events] == [
        ("one", "utf-8", {"trace-id": "4bf9", "n": "1"}, "utf-8"),
        ("two", "utf-8", {"trace-id": "4bf9", "n": "1"}, "utf-8"),
        ("three\nlines", "utf-8", {"from": "gateway", "Trace-Id": "e1"}, "utf-8"),
        (base64.b64encode(b"\xff\x00").decode(), "base64",
         {"from": base64.b64encode(b"gateway").decode(), "raw": base64.b64encode(b"\xfe").decode()}, "base64"),
        ("plain", "utf-8", {"from": "gateway"}, "utf-8")]
    assert all(e["time"].endswith("Z") and e["seq"] >= sent["first_seq"] for e in events)


@pytest.mark.parametrize("params, content, headers, says", [
    ({}, b"x", [("RoQ-Header-roq-reason", "nack")], "RoQ's own"),
    ({}, b"x", [("RoQ-Header-a", "1"), ("RoQ-Header-A", "2")], "twice"),
    ({}, b"x", [("RoQ-Header-", "1")], "keys are 1-128 bytes"),
    ({}, b"x", [("RoQ-Header-big", "v" * 8193)], "at most 8192"),
    ({"envelope": "json"}, b"{not json", [], "not JSON"),
    ({"envelope": "json"}, b'{"payload": "x", "priority": 3}', [], "unknown message fields priority"),
    ({"envelope": "json"}, b'{"payload": "%%%", "encoding": "base64"}', [], "not valid base64"),
    ({"envelope": "json"}, b'{"headers": {}}', [], "needs a payload"),
    ({"envelope": "json"}, b'{"payload": "x", "headers": {"k": 1}}', [], "must be a string"),
    ({"envelope": "json", "split": "lines"}, b"x", [], "do not go together"),
])
def test_bad_headers_over_http_are_refused_and_publish_nothing(web_cluster: WebCluster, params: dict[str, str],
                                                               content: bytes, headers: list[tuple[str, str]],
                                                               says: str) -> None:
    web = web_cluster
    if not read_live(web.zk, Paths(web.config.zk.root), "refused-q"):
        make_queue(web, "refused-q")
    answer = httpx.post(web.url + "/api/queues/refused-q/messages", params={"topic": "t", **params}, content=content,
                        headers=[*web.headers().items(), *headers], timeout=30)
    assert answer.status_code == 400 and says in answer.json()["message"], answer.text
    peeked = api(web, "GET", "/api/queues/refused-q/peek", params={"topic": "t"})
    assert peeked.status_code == 200 and peeked.json()["messages"] == [], peeked.text


@settings(max_examples=examples(6), deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(cuts=st.lists(st.integers(min_value=1, max_value=120), min_size=1, max_size=4))
def test_a_stream_cut_anywhere_resumes_from_its_last_event_id_with_nothing_lost_or_repeated(
        web_cluster: WebCluster, cuts: list[int]) -> None:
    web = web_cluster
    queue = "resume-q"
    paths = Paths(web.config.zk.root)
    if not read_live(web.zk, paths, queue):
        make_queue(web, queue, exchanges=2)
    marker = f"run-{random.getrandbits(40):x}"
    total = 300
    sent = [f"{marker}-{i}" for i in range(total)]
    received: list[dict[str, Any]] = []
    # Another topic in between, from the same (shared) publisher: the stream's sequence numbers have
    # gaps, so its position holds many runs and most ids are a base position plus a delta.
    for i in range(0, total, 10):
        publish_lines(web, queue, f"{marker}/ours", sent[i:i + 10])
        publish_lines(web, queue, f"{marker}/other", ["not for this stream"])
    marker = f"{marker}/ours"
    token: str | None = None
    for cut in [*cuts, total]:
        params: dict[str, Any] = {"topic": [marker]}
        if token is None:
            params["from"] = "beginning"
        else:
            params["last_event_id"] = token
        want = min(cut, total - len(received))
        if want <= 0:
            break
        batch = list(sse_events(web, queue, want, **params))
        received += batch
        token = batch[-1]["id"] if batch else token
    got = payloads_of(received)
    assert sorted(got) == sorted(sent), f"lost {len(set(sent) - set(got))}, repeated {len(got) - len(set(got))}"
    assert len(got) == len(set(got))


def test_a_stream_from_a_time_gets_exactly_what_was_stored_since_in_either_spelling(web_cluster: WebCluster) -> None:
    web = web_cluster
    with Admin(web.config) as admin:  # a disk storage policy: the store's time index answers too
        admin.create_queue("timed-q", exchanges=1, retention=3_600.0, retention_bytes=1 << 30)
    wait_until(lambda: read_live(web.zk, Paths(web.config.zk.root), "timed-q").get("x1"), timeout=20,
               message="x1 running")
    try:
        publish_lines(web, "timed-q", "t", [f"before-{i}" for i in range(50)])  # answered after the confirm
        since = time.time()
        wait_until(lambda: time.time() > since + 0.05, message="the clock to move past the first publish")
        after = [f"after-{i}" for i in range(50)]
        for i in range(0, 50, 10):
            publish_lines(web, "timed-q", "t", after[i:i + 10])
        iso = datetime.fromtimestamp(since, UTC).isoformat()  # "+00:00": httpx encodes the "+"
        millis = str(math.ceil(since * 1000))  # rounded up: past the first publish
        for start in (iso, iso.replace("+00:00", "Z"), millis):
            events = list(sse_events(web, "timed-q", 50, **{"from": start, "limit": 50}))
            assert payloads_of(events) == after, f"from={start}"
    finally:
        with Admin(web.config) as admin:  # its slot: the module's cluster has room for so many exchanges
            admin.delete_queue("timed-q")


@pytest.mark.parametrize("start, says", [
    ("yesterday", "is not a time"),
    ("2026-11-27T10:00:00", "has no time zone"),
    ("1969-12-31T23:59:59Z", "before 1970"),
    ("99999999999999999999", "past the year 9999"),
    ("x" * 65, "at most 64 characters"),
])
def test_a_stream_from_a_bad_time_is_a_clear_400_and_opens_nothing(web_cluster: WebCluster, start: str,
                                                                    says: str) -> None:
    answer = api(web_cluster, "GET", "/api/queues/resume-q/stream", params={"from": start, "limit": 1})
    assert answer.status_code == 400, answer.text
    assert says in answer.text
    if not start.startswith("x"):
        assert "now, beginning or a time" in answer.json()["message"]
    assert api(web_cluster, "GET", "/api/session", token="").status_code == 200


def test_a_token_from_one_gateway_resumes_on_another(web_cluster: WebCluster) -> None:
    web = web_cluster
    make_queue(web, "two-gw")
    sent = [f"m{i}" for i in range(200)]
    publish_lines(web, "two-gw", "t", sent)
    first = list(sse_events(web, "two-gw", 77, **{"from": "beginning"}))
    other = start_gateway(web.procs, "web-2")
    rest = list(sse_events(web, "two-gw", 200 - 77, url=other, last_event_id=first[-1]["id"]))
    assert payloads_of(first) + payloads_of(rest) == sent


def test_a_retry_with_the_same_idempotency_key_publishes_once(web_cluster: WebCluster) -> None:
    web = web_cluster
    make_queue(web, "idem-q")
    with Subscriber("idem-q", web.config) as sub:
        sub.wait_connected()
        first = publish_lines(web, "idem-q", "t", ["once"], **{"Idempotency-Key": "order-17"})
        again = publish_lines(web, "idem-q", "elsewhere", ["changed"], **{"Idempotency-Key": "order-17"})
        assert again["replayed"] is True and again["first_seq"] == first["first_seq"]
        assert again["topic"] == "t"  # what was published, not what the retry asked for
        publish_lines(web, "idem-q", "t", ["after"])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            msg = sub.receive(timeout=0.5)
            if msg is not None:
                got.append(msg.payload)
        assert sub.receive(timeout=1.0) is None
        assert got == [b"once", b"after"]


def test_every_confirmed_http_publish_survives_an_exchange_crash(web_cluster: WebCluster) -> None:
    web = web_cluster
    make_queue(web, "crash-q")
    confirmed: list[str] = []
    stop = threading.Event()
    failures: list[str] = []

    def publish_forever() -> None:
        n = 0
        while not stop.is_set():
            lines = [f"c{n + i}" for i in range(20)]
            n += 20
            try:
                answer = api(web, "POST", "/api/queues/crash-q/messages", params={"topic": "t", "split": "lines"},
                             content="\n".join(lines).encode())
            except httpx.HTTPError as exc:
                failures.append(str(exc))
                continue
            if answer.status_code == 200:
                confirmed.extend(lines)
            else:
                failures.append(answer.text)

    with Subscriber("crash-q", web.config) as sub:
        sub.wait_connected()
        worker = threading.Thread(target=publish_forever)
        worker.start()
        try:
            wait_until(lambda: len(confirmed) >= 200, timeout=20, message="traffic")
            pid = next(iter(read_live(web.zk, Paths(web.config.zk.root), "crash-q").values()))["pid"]
            os.kill(pid, signal.SIGKILL)
            before = len(confirmed)
            wait_until(lambda: len(confirmed) >= before + 200, timeout=30, message="confirms after the crash")
        finally:
            stop.set()
            worker.join(timeout=30)
        want = set(confirmed)
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while not want <= {g.decode() for g in got} and time.monotonic() < deadline:
            msg = sub.receive(timeout=0.5)
            if msg is not None:
                got.append(msg.payload)
    delivered = [g.decode() for g in got]
    assert want - set(delivered) == set(), f"{len(want - set(delivered))} confirmed messages lost"
    assert len(delivered) == len(set(delivered)), "a message was delivered twice"


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("path, params, status, code", [
    ("/api/queues/resume-q/messages", {}, 400, "bad_request"),  # no topic
    ("/api/queues/resume-q/messages?topic=%FF", {}, 400, "invalid_name"),  # not UTF-8
    ("/api/queues/no-such/messages", {"topic": "t"}, 404, "queue_not_found"),
    ("/api/queues/bad name/messages", {"topic": "t"}, 400, "invalid_name"),
    ("/api/queues/resume-q/messages", {"topic": "x" * 300}, 400, "invalid_name"),
])
def test_bad_publishes_get_a_clear_error(web_cluster: WebCluster, path: str, params: dict[str, str],
                                         status: int, code: str) -> None:
    answer = api(web_cluster, "POST", path, params=params or None, content=b"x")
    assert answer.status_code == status, answer.text
    assert answer.json()["error"] == code and answer.json()["message"]


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(token=st.one_of(st.text(min_size=1, max_size=300), st.binary(max_size=300).map(lambda b: "r1." + b.hex())))
def test_a_forged_or_damaged_resume_token_is_refused_and_harms_nothing(web_cluster: WebCluster, token: str) -> None:
    answer = api(web_cluster, "GET", "/api/queues/resume-q/stream", params={"position": token, "limit": 1})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] in ("bad_position", "bad_request")
    assert api(web_cluster, "GET", "/api/session", token="").status_code == 200
