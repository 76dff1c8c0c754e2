"""RoQ's client library: Admin (control API), Publisher and Subscriber (data path)."""

from roq.client.admin import Admin
from roq.client.publisher import Publisher
from roq.client.subscriber import Message, MessageBatch, Subscriber
from roq.client.worker import GroupMismatchError, GroupSubscriber, WorkMessage

__all__ = ["Admin", "GroupMismatchError", "GroupSubscriber", "Message", "MessageBatch", "Publisher", "Subscriber",
           "WorkMessage"]
