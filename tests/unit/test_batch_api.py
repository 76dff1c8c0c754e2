"""The batch API's pure parts: payload checks, MessageBatch, argument checks."""

from __future__ import annotations

import pytest

from roq.client.publisher.checks import checked_payloads as _checked_payloads
from roq.client.subscriber import Message, MessageBatch, Subscriber
from roq.config import Config
from roq.errors import MessageTooLargeError


def test_payload_lists_are_checked_whole_and_buffers_become_bytes() -> None:
    same = [b"a", b"bc"]
    assert _checked_payloads(same, 10) is same  # the common case costs no copy
    assert _checked_payloads((b"a", bytearray(b"b"), memoryview(b"c")), 10) == [b"a", b"b", b"c"]
    assert _checked_payloads(iter([]), 10) == []
    with pytest.raises(TypeError, match="payload 1 must be bytes, not int"):
        _checked_payloads([b"a", 3], 10)
    with pytest.raises(MessageTooLargeError, match="payload 2 of 11 bytes"):
        _checked_payloads([b"a", b"b", b"x" * 11], 10)


def test_a_message_batch_unfolds_into_messages() -> None:
    batch = MessageBatch(b"t", [b"x", b"y"], "p-1", [7, 8], "x1", 99, "x1.ab", 3)
    assert list(batch.messages()) == [Message(b"t", b"x", "p-1", 7, "x1", 99, "x1.ab", 3),
                                      Message(b"t", b"y", "p-1", 8, "x1", 99, "x1.ab", 3)]


def test_a_subscriber_takes_one_kind_of_callback() -> None:
    with pytest.raises(ValueError, match="not both"):
        Subscriber("q", Config(), callback=print, batch_callback=print)
