"""The client by role (docs/client.md): what every client shares (close once, context manager,
the ZooKeeper client stopped only if it is its own), the typed statistics, and the group member as
a type of its own. Nothing here needs a cluster: the checks that run before any connection do."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import roq.client
from roq.client import GroupMember, MemberStats, PublisherStats, Subscriber, SubscriberStats
from roq.client.lifecycle import ClientLifecycle
from roq.config import Config
from roq.errors import InvalidNameError, UserError


def test_everything_the_package_exported_before_is_still_there() -> None:
    for name in ("Admin", "GroupMismatchError", "GroupSubscriber", "Message", "MessageBatch", "Publisher",
                 "Subscriber", "WorkMessage"):
        assert name in roq.client.__all__ and hasattr(roq.client, name)
    assert roq.client.GroupSubscriber is GroupMember


def test_a_group_member_is_its_own_type_and_subscriber_group_still_makes_one_with_a_warning() -> None:
    assert not issubclass(GroupMember, Subscriber)
    with pytest.raises(InvalidNameError):  # checked before any connection
        GroupMember("q", Config(), group="not a name")
    with pytest.warns(DeprecationWarning, match="GroupMember"), pytest.raises(InvalidNameError):
        Subscriber("q", Config(), group="not a name")
    with pytest.warns(DeprecationWarning), pytest.raises(UserError, match="durable"):
        Subscriber("q", Config(), group="workers", durable="d")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plain subscriber does not warn
        with pytest.raises(ValueError):
            Subscriber("q", Config(), callback=print, batch_callback=print)


def test_statistics_are_frozen_and_their_dict_keeps_the_names_roq_subscribe_printed() -> None:
    sub = SubscriberStats(received=3, duplicates=1, gaps=0, unknown_gaps=0, recovered_frames=2, fetches=1,
                          fetch_failures=0, resyncs=0, position_checks=4, callback_errors=0, exchanges=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sub.gaps = 1  # type: ignore[misc]
    assert set(sub.as_dict()) == {"received", "duplicates", "gaps", "unknown_gaps", "recovered_frames", "fetches",
                                  "fetch_failures", "resyncs", "position_checks", "callback_errors", "exchanges"}
    member = MemberStats(received=1, acked=1, nacked=0, redelivered=0, callback_errors=0, exchanges=1)
    assert member.as_dict()["exchanges"] == 1  # the same name as a subscriber's (it was "joined")
    pub = PublisherStats(exchange="x1", subscribers=1, published=5, confirmed=5, unconfirmed=0, moves=0,
                         relocations=0, resends=0, reconnects=0, replayed=0, rejected=0)
    assert pub.as_dict()["exchange"] == "x1"


class _Counting(ClientLifecycle):
    def __init__(self) -> None:
        self.shut_downs = 0

    def _shut_down(self) -> None:
        self.shut_downs += 1


def test_close_runs_once_and_the_with_block_closes() -> None:
    with _Counting() as client:
        assert client.shut_downs == 0
    assert client.shut_downs == 1
    client.close()
    assert client.shut_downs == 1


def test_a_given_metadata_client_is_not_closed() -> None:
    class Given:
        closed = False

        def close(self) -> None:
            self.closed = True

    client = _Counting()
    given = Given()
    client._use_metadata(Config(), given)  # type: ignore[arg-type]
    client.close()
    assert client.metadata is given and not given.closed
