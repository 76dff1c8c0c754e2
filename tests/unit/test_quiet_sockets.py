"""Sockets polled by their ZMQ_FD (exchange/quiet.py): an edge-triggered descriptor, so a drain
that stops at its budget with input left must be drained again without waiting for a new signal.

Real ZeroMQ sockets over TCP: bursts of requests of any size against drains of any budget. Every
request must be handled, and never by the sweep that runs when a poll times out (the poll waits
far longer than any test would): a missed edge would show as a timed-out poll."""

from __future__ import annotations

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from exchange.quiet import QuietSockets
from tests.profiles import examples

pytestmark = pytest.mark.timeout(120)
LONG_POLL_MS = 30_000  # a poll that times out means a request waited for the sweep


@pytest.fixture(scope="module")
def pair():
    context = zmq.Context()
    router, dealer = context.socket(zmq.ROUTER), context.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    yield router, dealer
    router.close()
    dealer.close()
    context.term()


@settings(max_examples=examples(25), deadline=None)
@given(bursts=st.lists(st.integers(1, 60), min_size=1, max_size=6), budget=st.integers(1, 8))
def test_every_request_is_drained_without_waiting_for_a_new_signal(pair, bursts, budget):
    router, dealer = pair
    handled: list[int] = []

    def drain() -> None:  # as the exchange's drains: until Again or the budget
        for _ in range(budget):
            try:
                _, body = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            handled.append(int(body))

    poller = zmq.Poller()
    handlers: dict = {}
    quiet = QuietSockets()
    quiet.add(router, drain, poller, handlers)
    sent = 0
    try:
        for burst in bursts:
            for _ in range(burst):
                dealer.send(str(sent).encode())
                sent += 1
            while len(handled) < sent:
                polled = poller.poll(0 if quiet.pending else LONG_POLL_MS)
                assert polled or quiet.pending, f"{sent - len(handled)} requests left behind a missed edge"
                for fd, _ in polled:
                    handlers[fd]()
                quiet.turn(polled)
    finally:
        poller.unregister(next(iter(handlers)))
    assert handled == list(range(sent))
    assert not quiet.pending


def test_a_timed_out_poll_drains_every_quiet_socket(pair):
    router, dealer = pair
    handled: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                handled.append(router.recv_multipart(zmq.NOBLOCK)[1])
            except zmq.Again:
                return

    poller = zmq.Poller()
    quiet = QuietSockets()
    quiet.add(router, drain, poller, {})
    dealer.send(b"late")
    # Wait for the request in libzmq's own way, then take the sweep's path without polling.
    assert router.poll(10_000)
    quiet.turn([])
    assert handled == [b"late"]
