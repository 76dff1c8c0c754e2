from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gcm.api import ControlServer
from roq import protocol
from roq.errors import InvalidNameError, ProtocolError, QueueNotFoundError, error_from_code
from roq.names import check_queue_name, check_topic

PID = protocol.publisher_id_for(bytes(range(16)))  # p-9cda9765a71f364072d21550, the test vector of section 3.1


def test_request_round_trip() -> None:
    req = protocol.decode_request(protocol.encode_request(5, "queue.create", {"name": "q"}))
    assert (req.id, req.op, req.args) == (5, "queue.create", {"name": "q"})


@pytest.mark.parametrize("frame", [b"", b"\xc1", msgpack.packb([]), msgpack.packb({"v": 2, "id": 1, "op": "x"}),
                                   msgpack.packb({"v": 1, "id": True, "op": "x"}),
                                   msgpack.packb({"v": 1, "id": 1, "op": "x", "args": 3})])
def test_bad_requests(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        protocol.decode_request(frame)


def test_errors_keep_their_code_across_the_wire() -> None:
    reply = protocol.decode_reply(protocol.encode_error(3, QueueNotFoundError("queue 'x' does not exist")))
    err = error_from_code(reply.code, reply.message, reply.leader)
    assert isinstance(err, QueueNotFoundError) and reply.id == 3 and "does not exist" in str(err)


def test_batch_round_trip_and_validation() -> None:
    batch = protocol.decode_publisher_frame(protocol.encode_batch(PID, 7, 1, [b"t", b"x"]), 1 << 20)
    assert isinstance(batch, protocol.Batch) and batch.first_seq == 7 and batch.flat == [b"t", b"x"]
    for bad in ([1], ["batch", 3, PID, 0, 1, [b"t", b"x"]], ["zzz", 3, "p"], ["hello", 9, "p"], ["hello", 3, ""],
                ["hello", 3, PID, b"short", 1], ["batch", 1, PID, 1, 1, [b"t", b"x"]]):
        with pytest.raises(ProtocolError):
            protocol.decode_publisher_frame(msgpack.packb(bad), 1 << 20)
    with pytest.raises(ProtocolError, match="exceeds"):
        protocol.decode_publisher_frame(b"x" * 100, 10)


@pytest.mark.parametrize("bad", [
    ["batch", 3, PID, 1, 1.5, [b"t", b"x"]],  # a float sent_ns (a hostile publisher's)
    ["batch", 3, PID, 1, -1, [b"t", b"x"]],
    ["batch", 3, PID, 1, 1, [b"odd"]],
    ["batch", 3, PID, 1, 1, []],
    ["batch", 3, PID, 2**63 - 1, 0, [b"t", b"x", b"t", b"y"]],  # would pass the largest sequence number
])
def test_refused_batches_name_their_publisher_and_first_seq(bad: list) -> None:
    """A batch refused as a whole is attributed, so the exchange answers `resend` (never a silent
    refusal the next ack would cover)."""
    with pytest.raises(protocol.RefusedBatch) as refused:
        protocol.decode_publisher_frame(msgpack.packb(bad), 1 << 20)
    assert refused.value.publisher == PID and refused.value.first_seq == bad[3]


@pytest.mark.parametrize("first_seq", [2**63, 2**64 - 1, 0, -5])
def test_sequence_numbers_out_of_range_are_refused_at_decode(first_seq: int) -> None:
    """A regression: 2**64-1 used to overflow msgpack inside the exchange and end it."""
    with pytest.raises(ProtocolError):
        protocol.decode_publisher_frame(msgpack.packb(["batch", 3, PID, first_seq, 0, [b"t", b"x"]]), 1 << 20)


def test_publisher_ids_are_derived_from_their_token() -> None:
    token = b"k" * 16
    hello = protocol.decode_publisher_frame(protocol.encode_hello(protocol.publisher_id_for(token), token, 5), 4096)
    assert isinstance(hello, protocol.Hello) and hello.from_seq == 5
    assert protocol.publisher_id_for(token) != protocol.publisher_id_for(b"j" * 16)
    vector = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
    assert f"gives `{PID}`" in vector.read_text()  # the test vector of section 3.1


@pytest.mark.parametrize("pid", ["p", "x" * 128, PID.upper(), "P" + PID[1:], PID + "0", PID[:-1], PID[:-1] + "g",
                                 " " + PID, PID + "\n", "dl-x1.0badf00d"])
def test_a_publisher_id_of_another_shape_is_malformed_in_every_publisher_frame(pid: str) -> None:
    """One rule for hello, batch and bye. A batch used to take any id of 1-128
    characters (then answered `resend hello_required`), a hello any such id (then `error refused`)."""
    head, block = protocol.encode_batch_parts(pid, 1, 0, b"t", [b"x"])
    for frame, second in ((protocol.encode_hello(pid, b"t" * 16, 1), None),
                          (protocol.encode_batch(pid, 1, 0, [b"t", b"x"]), None), (head, block),
                          (protocol.encode_bye(pid), None)):
        with pytest.raises(ProtocolError, match="publisher id") as refused:
            protocol.decode_publisher_frame(frame, 1 << 20, second)
        assert not isinstance(refused.value, protocol.RefusedBatch)  # not attributable: `error malformed`


def test_names() -> None:
    assert check_queue_name("orders-eu.1") == "orders-eu.1"
    for bad in ("", "-x", "a/b", "a~b", "..", "x" * 64, 3, None, "abc\n"):
        with pytest.raises(InvalidNameError):
            check_queue_name(bad)
    assert check_topic("t") == b"t"
    for bad in ("", b"x" * 256, 5):
        with pytest.raises(InvalidNameError):
            check_topic(bad)


def _route(op: str):
    if op == "boom":
        return lambda args: 1 / 0
    if op == "echo":
        return lambda args: args
    raise InvalidNameError("nope")


@given(st.binary(max_size=200))
def test_dispatch_always_answers(frame: bytes) -> None:
    server = ControlServer.__new__(ControlServer)  # dispatch needs no socket
    server._route, server.errors = _route, 0
    reply = protocol.decode_reply(server.dispatch(frame, "admin"))
    assert isinstance(reply.ok, bool)


def test_dispatch_reports_internal_errors_and_keeps_ids() -> None:
    server = ControlServer.__new__(ControlServer)
    server._route, server.errors = _route, 0
    reply = protocol.decode_reply(server.dispatch(protocol.encode_request(9, "boom"), "admin"))
    assert not reply.ok and reply.code == "internal" and reply.id == 9
    reply = protocol.decode_reply(server.dispatch(protocol.encode_request(10, "echo", {"a": 1}), "admin"))
    assert reply.ok and reply.result == {"a": 1}


@pytest.mark.parametrize("role", ["client", "server", None])
def test_only_admins_change_the_cluster(role: str | None) -> None:
    server = ControlServer.__new__(ControlServer)
    server._route, server.errors = lambda op: (lambda args: "done"), 0
    for op, args in (("queue.create", {"name": "q"}), ("queue.delete", {"name": "q"}),
                     ("queue.scale", {"name": "q", "exchanges": 2}), ("queue.rules", {"name": "q", "clear": True})):
        reply = protocol.decode_reply(server.dispatch(protocol.encode_request(1, op, args), role))
        assert not reply.ok and reply.code == "forbidden", op
    for op, args in (("queue.list", {}), ("queue.describe", {"name": "q"}), ("queue.rules", {"name": "q"}),
                     ("cluster.status", {})):
        assert protocol.decode_reply(server.dispatch(protocol.encode_request(2, op, args), role)).ok, op
    assert protocol.decode_reply(server.dispatch(protocol.encode_request(3, "queue.create", {"name": "q"}),
                                                 "admin")).ok
