"""The subscribing side of the client: `Subscriber` (api), the messages it hands over (messages),
its I/O thread (receiver), the stream rules that find and fill holes (streams), its way to the
exchanges' retention (replay, copies) and what the application has taken (progress, checkpoint)."""

from roq.client.headers import EMPTY_HEADERS
from roq.client.stats import SubscriberStats
from roq.client.subscriber.api import Subscriber
from roq.client.subscriber.messages import Message, MessageBatch

__all__ = ["EMPTY_HEADERS", "Message", "MessageBatch", "Subscriber", "SubscriberStats"]
