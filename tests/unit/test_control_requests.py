"""Control requests: the optional request key on the wire, the deadline counted from arrival, and a
request of more than one frame answered with its id."""

from __future__ import annotations

import time
import uuid

import msgpack
import pytest
import zmq

from gcm.api import REQUEST_DEADLINE, ControlServer
from roq import protocol
from roq.config import Config
from roq.errors import ProtocolError


def test_a_key_travels_with_the_request() -> None:
    key = uuid.uuid4().hex
    req = protocol.decode_request(protocol.encode_request(5, "queue.create", {"name": "q"}, key))
    assert (req.id, req.op, req.args, req.key) == (5, "queue.create", {"name": "q"}, key)


def test_requests_of_old_clients_have_no_key() -> None:
    frame = msgpack.packb({"v": 1, "id": 1, "op": "queue.create", "args": {"name": "q"}})
    assert protocol.decode_request(frame).key is None
    assert b"key" not in protocol.encode_request(1, "queue.list")


@pytest.mark.parametrize("key", ["", "short", "a" * 65, "../../gcm/leader", "abc/defgh", "abcdefgh\n", 12345678,
                                 b"abcdefgh", ["abcdefgh"]])
def test_bad_keys_are_malformed(key: object) -> None:
    # The key names a znode: nothing but ZooKeeper-safe characters may reach it.
    frame = msgpack.packb({"v": 1, "id": 1, "op": "queue.create", "args": {}, "key": key})
    with pytest.raises(ProtocolError, match="key"):
        protocol.decode_request(frame)


def server() -> ControlServer:
    server = ControlServer.__new__(ControlServer)  # dispatch needs no socket
    server._route, server.errors = (lambda op: (lambda args: "done")), 0
    return server


def test_a_write_that_waited_past_the_deadline_is_refused_unapplied() -> None:
    ran: list[str] = []
    stale = server()
    stale._route = lambda op: (lambda args: ran.append(op))
    long_ago = time.monotonic() - REQUEST_DEADLINE - 0.5
    for op, args in (("queue.create", {"name": "q"}), ("queue.delete", {"name": "q"}),
                     ("queue.scale", {"name": "q", "exchanges": 2}), ("queue.rules", {"name": "q", "clear": True})):
        reply = protocol.decode_reply(stale.dispatch(protocol.encode_request(1, op, args, uuid.uuid4().hex),
                                                     "admin", long_ago))
        assert not reply.ok and reply.code == "unavailable" and "waited" in reply.message, (op, reply)
    assert ran == []  # no handler ran
    reply = protocol.decode_reply(stale.dispatch(protocol.encode_request(2, "queue.list"), "admin", long_ago))
    assert reply.ok  # a read is still answered


def test_a_fresh_write_is_served() -> None:
    reply = protocol.decode_reply(server().dispatch(protocol.encode_request(1, "queue.create", {"name": "q"}),
                                                    "admin", time.monotonic()))
    assert reply.ok and reply.result == "done"


def test_a_request_of_two_frames_is_refused_with_its_id_over_a_real_socket() -> None:
    """A regression: the id of a request sent in two frames was not echoed (nil), so the
    client could not match the `malformed` answer to its request."""
    api = ControlServer(Config(), "127.0.0.1", 0, "127.0.0.1", lambda op: (lambda args: "done"))
    api.start()
    context = zmq.Context()
    client = context.socket(zmq.DEALER)
    client.linger = 0
    try:
        client.connect(api.endpoint)
        client.send_multipart([protocol.encode_request(41, "queue.list"), b"more"])
        assert client.poll(5000), "no answer"
        reply = protocol.decode_reply(client.recv())
        assert (reply.ok, reply.code, reply.id) == (False, "malformed", 41) and "one frame" in reply.message
        client.send_multipart([b"\xc1", b"more"])  # no id to read: nil
        assert client.poll(5000), "no answer"
        reply = protocol.decode_reply(client.recv())
        assert (reply.ok, reply.code, reply.id) == (False, "malformed", None)
        client.send(protocol.encode_request(42, "queue.list"))  # the server goes on
        assert client.poll(5000), "no answer"
        reply = protocol.decode_reply(client.recv())
        assert (reply.ok, reply.id, reply.result) == (True, 42, "done")
    finally:
        client.close()
        context.term()
        api.stop()


def test_the_control_socket_queues_a_crowd_of_connections() -> None:
    """Thousands of clients move to a surviving GCM at once: its accept queue is roq.listen's, not
    libzmq's 100 (past which their SYNs were dropped and retried after up to 16 s)."""
    from roq.listen import LISTEN_BACKLOG
    api = ControlServer(Config(), "127.0.0.1", 0, "127.0.0.1", lambda op: (lambda args: "done"))
    try:
        assert api._socket.getsockopt(zmq.BACKLOG) == LISTEN_BACKLOG
    finally:
        api._socket.close(linger=0)
        api.gatekeeper.stop()
