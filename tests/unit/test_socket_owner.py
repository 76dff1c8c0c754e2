"""SocketOwner (client.caller_send): an application thread sends only while nobody holds the
socket, and wakes the I/O thread when a reply waits that its send may have hidden from ZMQ_FD.
Real DEALER and ROUTER sockets over TCP."""

from __future__ import annotations

import select
from collections.abc import Iterator

import pytest
import zmq

from roq.client.publisher.socket_owner import SocketOwner

WAIT = 5.0


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket, bytes]]:
    """A connected DEALER and ROUTER, and the DEALER's identity at the ROUTER."""
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send(b"hello")
    assert router.poll(int(WAIT * 1000))
    identity, _ = router.recv_multipart()
    yield dealer, router, identity
    dealer.close(0)
    router.close(0)
    ctx.term()


def fd_readable(fd: int, timeout: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(int(timeout * 1000)))


def test_a_callers_send_that_finds_a_reply_waiting_wakes_the_io_thread(pair) -> None:
    dealer, router, identity = pair
    owner = SocketOwner(enabled=True)
    fd = owner.poll_target(dealer)
    assert isinstance(fd, int) and not owner.readable(dealer)
    owner.offer(dealer)
    woken: list[bool] = []
    router.send_multipart([identity, b"ack"])
    assert fd_readable(fd, WAIT)  # what the sleeping I/O thread would see
    assert owner.try_send(lambda sock: sock.send(b"batch") is None, lambda: woken.append(True))
    assert woken == [True]  # the send processed the reply's signal: the I/O thread is told another way
    assert owner.readable(dealer) and dealer.recv() == b"ack"
    assert owner.caller_sends == 1
    assert router.poll(int(WAIT * 1000)) and router.recv_multipart() == [identity, b"batch"]


def test_without_a_reply_waiting_the_io_thread_sleeps_on(pair) -> None:
    dealer, router, _ = pair
    owner = SocketOwner(enabled=True)
    owner.offer(dealer)
    woken: list[bool] = []
    assert owner.try_send(lambda sock: sock.send(b"batch") is None, lambda: woken.append(True))
    assert router.poll(int(WAIT * 1000))
    assert woken == []


def test_nothing_is_sent_while_the_io_thread_holds_the_socket_or_offers_none(pair) -> None:
    dealer, router, _ = pair
    calls: list[zmq.Socket] = []

    def send(sock: zmq.Socket) -> bool:
        calls.append(sock)
        return True

    owner = SocketOwner(enabled=True)
    owner.offer(dealer)
    with owner.lock:  # the I/O thread's turn
        assert not owner.try_send(send, lambda: None)
    owner.offer(None)  # moving or closing
    assert not owner.try_send(send, lambda: None)
    disabled = SocketOwner(enabled=False)
    disabled.offer(dealer)
    assert disabled.sock is None and disabled.poll_target(dealer) is dealer and not disabled.readable(dealer)
    assert not disabled.try_send(send, lambda: None)
    assert calls == [] and owner.caller_sends == 0
    assert not owner.lock.locked()


def test_a_declined_send_is_not_counted_and_lets_go(pair) -> None:
    dealer, _, _ = pair
    owner = SocketOwner(enabled=True)
    owner.offer(dealer)
    assert not owner.try_send(lambda sock: False, lambda: None)
    assert owner.caller_sends == 0 and not owner.lock.locked()


def test_the_io_thread_lets_go_only_while_it_sleeps(pair) -> None:
    dealer, _, _ = pair
    owner = SocketOwner(enabled=True)
    owner.offer(dealer)
    sent: list[bool] = []
    with owner.lock:  # its turn
        assert not owner.try_send(lambda sock: sent.append(True) or True, lambda: None)
        with owner.released():  # its sleep
            assert owner.try_send(lambda sock: sent.append(True) or True, lambda: None)
        assert owner.lock.locked()  # awake again: the socket is its own
    assert sent == [True]
