"""The consumer group side of the client: `GroupMember` (api), the messages it hands over to ack
or nack (messages) and its I/O thread, one connection per exchange (exchange_links)."""

from roq.client.group_member.api import GroupMember, GroupMismatchError, GroupSubscriber
from roq.client.group_member.messages import WorkMessage
from roq.client.stats import MemberStats

__all__ = ["GroupMember", "GroupMismatchError", "GroupSubscriber", "MemberStats", "WorkMessage"]
