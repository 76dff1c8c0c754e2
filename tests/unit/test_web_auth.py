"""The gateway's credentials and resume tokens, without a cluster: tokens files (made, read,
refused when malformed), who a request is, the cross-site check, and resume tokens that round-trip
any position and refuse anything else."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from roq.client.subscriber.checkpoint import Checkpoint
from roq.errors import ConfigError
from roq_web.auth import Guard, add_token, cross_site, read_tokens, token_hash, trusted_host
from roq_web.gateway import DELTA_MARK, ResumeTokenError, _b64, decode_token, encode_token


def test_a_new_token_is_stored_only_as_its_hash_in_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    token = add_token(path, "ops", "admin")
    text = path.read_text()
    assert token not in text and token_hash(token) in text
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_tokens(path) == {token_hash(token): ("ops", "admin")}


@pytest.mark.parametrize("name, role", [("ops", "root"), ("bad name", "admin"), ("", "client"), ("../x", "admin")])
def test_bad_token_names_and_roles_are_refused(tmp_path: Path, name: str, role: str) -> None:
    with pytest.raises(ConfigError):
        add_token(tmp_path / "tokens", name, role)
    assert not (tmp_path / "tokens").exists()


def test_a_token_name_is_not_given_twice(tmp_path: Path) -> None:
    add_token(tmp_path / "tokens", "ops", "admin")
    with pytest.raises(ConfigError, match="already has a token named 'ops'"):
        add_token(tmp_path / "tokens", "ops", "client")


@given(st.text(max_size=200).filter(lambda s: "\n" not in s and "\r" not in s))
def test_a_malformed_tokens_file_is_a_config_error_naming_the_line(tmp_path_factory: pytest.TempPathFactory,
                                                                    line: str) -> None:
    path = tmp_path_factory.mktemp("tokens") / "tokens"
    path.write_text(f"ops admin {'a' * 64}\n{line}\n")
    try:
        tokens = read_tokens(path)
    except ConfigError as exc:
        assert "line 2" in str(exc)
    else:
        assert ("ops", "admin") in tokens.values()


def test_requests_are_identified_by_token_or_session_and_lose_access_when_the_token_goes(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    admin, client = add_token(path, "ops", "admin"), add_token(path, "app", "client")
    guard = Guard(True, str(path), 60.0)
    assert guard.identify(None, None) is None
    assert guard.identify("Bearer roq_wrong", None) is None
    assert guard.identify(f"Basic {admin}", None) is None
    ops = guard.identify(f"Bearer {admin}", None)
    assert ops is not None and ops.is_admin
    app = guard.identify(f"Bearer {client}", None)
    assert app is not None and not app.is_admin
    session_id, who = guard.sessions.open("app", "client")
    assert guard.identify(None, session_id) == who and who.csrf
    assert guard.identify(None, "forged-session") is None
    path.write_text(f"ops admin {token_hash(admin)}\n")  # app's token removed
    guard._looked_at = 0.0  # the file is looked at again at once, not after TOKENS_RELOAD_EVERY
    guard._mtime = None
    assert guard.identify(f"Bearer {client}", None) is None
    assert guard.identify(None, session_id) is None


def test_auth_on_without_a_tokens_file_stops_the_gateway_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Guard(True, str(tmp_path / "missing"), 60.0)


@pytest.mark.parametrize("method, origin, fetch_site, host, refused", [
    ("GET", "https://evil.example", "cross-site", "gw:8080", False),  # reads are not CSRF targets
    ("POST", None, None, "gw:8080", False),  # curl: neither header
    ("POST", "http://gw:8080", "same-origin", "gw:8080", False),
    ("POST", "https://evil.example", None, "gw:8080", True),
    ("DELETE", "http://gw:9999", None, "gw:8080", True),
    ("PUT", None, "cross-site", "gw:8080", True),
    ("POST", "null", None, "gw:8080", True),  # sandboxed frames and file: pages
])
def test_unsafe_requests_from_another_site_are_recognised(method: str, origin: str | None, fetch_site: str | None,
                                                          host: str, refused: bool) -> None:
    assert cross_site(method, origin, fetch_site, host) is refused


positions = st.builds(
    lambda pubs, streams: {"version": 1, "streams": streams, "start_at_sync": [],
                           "publishers": {p: {"floor": f, "runs": [[f + 1, f + 1 + n]]} for p, (f, n) in pubs.items()}},
    st.dictionaries(st.from_regex(r"p-[0-9a-f]{24}", fullmatch=True),
                    st.tuples(st.integers(0, 10**9), st.integers(0, 10**6)), max_size=20),
    st.dictionaries(st.from_regex(r"x[0-9]{1,3}\.[0-9a-f]{8}", fullmatch=True), st.integers(0, 2**62), max_size=10))


@given(positions)
def test_a_resume_token_round_trips_any_position(position: dict) -> None:
    token = encode_token(position)
    assert token.isascii() and "\n" not in token  # it goes into an SSE id line and an HTTP header
    assert Checkpoint.from_json(decode_token(token)).to_json() == Checkpoint.from_json(position).to_json()


@given(st.one_of(st.text(max_size=400), st.binary(max_size=400).map(lambda b: "r1." + b.hex()),
                 positions.map(encode_token).map(lambda t: t[:-3])))
def test_anything_but_a_resume_token_is_refused_with_a_clear_error(token: str) -> None:
    with pytest.raises(ResumeTokenError):
        decode_token(token)


@pytest.mark.parametrize("host, names, trusted", [
    ("127.0.0.1:8080", "", True), ("[::1]:8080", "", True), ("localhost:8080", "", True),
    ("10.0.0.5:8080", "", True), ("console.example:8080", "", False), ("console.example:8080", "console.example", True),
    ("evil.example", "console.example", False), (None, "", True),
])
def test_without_auth_only_addresses_localhost_and_listed_names_are_trusted_hosts(host: str | None, names: str,
                                                                                  trusted: bool) -> None:
    assert trusted_host(host, names) is trusted


@given(positions, st.lists(st.tuples(st.sampled_from(["p-" + "a" * 24, "p-" + "b" * 24]), st.integers(1, 10**6),
                                     st.integers(0, 5)), min_size=1, max_size=8))
def test_a_token_with_a_delta_marks_the_listed_messages_seen(position: dict, runs: list) -> None:
    delta = [[p, first, first + extra] for p, first, extra in runs]
    token = encode_token(position) + DELTA_MARK + _b64(msgpack.packb(delta))
    resumed = Checkpoint.from_json(decode_token(token))
    for publisher, first, last in delta:
        seen = resumed.seen(publisher)
        assert all(not seen.add(seq) for seq in range(first, last + 1))
