"""RoQ's client library: Admin (control API), Publisher and Subscriber (data path), GroupMember
(a consumer group's member), each in its own subpackage, and what they return from stats()."""

from roq.client.admin import Admin
from roq.client.group_member import GroupMember, GroupMismatchError, GroupSubscriber, WorkMessage
from roq.client.publisher import Publisher
from roq.client.stats import MemberStats, PublisherStats, SubscriberStats
from roq.client.subscriber import Message, MessageBatch, Subscriber

__all__ = ["Admin", "GroupMember", "GroupMismatchError", "GroupSubscriber", "MemberStats", "Message", "MessageBatch",
           "Publisher", "PublisherStats", "Subscriber", "SubscriberStats", "WorkMessage"]
