"""The confirm gate (exchange/confirms.py): acks held until what they confirm is durable."""

from __future__ import annotations

from exchange.confirms import ConfirmGate


def released(gate: ConfirmGate, durable: int) -> list[tuple[str, int]]:
    return [(ack.publisher, ack.seq) for ack in gate.release(durable)]


def test_nothing_is_released_before_every_position_below_required_is_durable() -> None:
    gate = ConfirmGate()
    gate.hold(5, b"r1", "p-1", 3)
    assert released(gate, 4) == [] and len(gate) == 1
    assert gate.confirmed == {}
    assert released(gate, 5) == [("p-1", 3)] and len(gate) == 0
    assert gate.confirmed == {"p-1": 3}


def test_acks_leave_in_the_order_they_were_held_and_stop_at_the_first_not_durable() -> None:
    gate = ConfirmGate()
    gate.hold(2, b"r1", "p-1", 1)
    gate.hold(4, b"r2", "p-2", 7)
    gate.hold(4, b"r1", "p-1", 2)
    gate.hold(9, b"r2", "p-2", 8)
    acks = list(gate.release(4))
    assert [(a.route, a.publisher, a.seq, a.required) for a in acks] == [
        (b"r1", "p-1", 1, 2), (b"r2", "p-2", 7, 4), (b"r1", "p-1", 2, 4)]
    assert len(gate) == 1 and gate.confirmed == {"p-1": 2, "p-2": 7}
    assert released(gate, 8) == []  # required 9: position 8 is not durable yet
    assert released(gate, 100) == [("p-2", 8)]


def test_release_is_lazy_an_unconsumed_ack_stays_held() -> None:
    gate = ConfirmGate()
    gate.hold(1, b"r", "p-1", 1)
    gate.hold(1, b"r", "p-1", 2)
    it = gate.release(10)
    assert next(it).seq == 1
    del it
    assert len(gate) == 1 and gate.confirmed == {"p-1": 1}


def test_confirmed_never_goes_down_when_an_older_ack_of_a_publisher_is_released_later() -> None:
    """A publisher reconnected and resent: the newer connection's ack (higher seq) may be held
    before an older one of a lower seq; `confirmed` is the highest released."""
    gate = ConfirmGate()
    gate.hold(3, b"old", "p-1", 9)
    gate.hold(3, b"new", "p-1", 4)
    assert released(gate, 3) == [("p-1", 9), ("p-1", 4)]
    assert gate.confirmed == {"p-1": 9}


def test_a_welcome_names_what_was_released_or_the_publishers_own_floor() -> None:
    gate = ConfirmGate()
    assert gate.welcome_seq("p-1", 0) == 0
    assert gate.welcome_seq("p-1", 6) == 6  # from_seq 7: the publisher had 1..6 confirmed already
    gate.hold(2, b"r", "p-1", 10)
    assert gate.welcome_seq("p-1", 6) == 6  # held, not released: a welcome must not confirm it
    released(gate, 2)
    assert gate.welcome_seq("p-1", 6) == 10
    assert gate.welcome_seq("p-1", 12) == 12
    assert gate.welcome_seq("p-2", 0) == 0


def test_forget_drops_confirmed_publishers_but_not_held_acks() -> None:
    gate = ConfirmGate()
    gate.hold(1, b"r", "p-1", 1)
    gate.hold(1, b"r", "p-2", 1)
    released(gate, 1)
    gate.hold(5, b"r", "p-1", 2)
    gate.forget({"p-1", "p-unknown"})
    assert gate.confirmed == {"p-2": 1}
    assert gate.welcome_seq("p-1", 0) == 0
    assert released(gate, 5) == [("p-1", 2)]  # a held ack still leaves, and counts again
    assert gate.confirmed == {"p-2": 1, "p-1": 2}
