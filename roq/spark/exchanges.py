"""What the `roq` source asks the cluster: where each exchange's stream stands, and its frames.

The driver follows the queue's running exchanges and their replay endpoints through the GCMs
(cluster.seeds, never ZooKeeper) and asks each exchange for its position at every offset. Executors, and the driver
when it counts messages for `maxOffsetsPerTrigger`, fetch frames straight from the
exchanges' replay endpoints (docs/protocol.md section 5). An
exchange that does not answer a position request within FETCH_TIMEOUT_MS is left out
of that offset (its frames stay retained for the next); one that does not answer a
fetch fails the task, which Spark retries.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from roq.client.subscriber.from_time import earlier_incarnations, taken_before
from roq.spark.chains import Copies
from roq.spark.options import config_from

log = logging.getLogger(__name__)

FETCH_TIMEOUT_MS = 10_000
PAGE_BYTES = 4 << 20


@dataclass(frozen=True)
class StreamEnd:
    """Where one exchange's stream stands: `pos` the last frame sent, `oldest` the oldest retained."""
    inc: str
    pos: int
    oldest: int
    replay: str


class QueueView:
    """The driver's view of one queue, from the GCMs (roq.client.metadata: no ZooKeeper). A stream
    asks at every trigger, so the view is kept until close() (the reader's stop()): one metadata
    conversation per query, not one per trigger. Never pickled with it (Spark ships readers to
    executors)."""

    def __init__(self, conn: dict[str, str], queue: str) -> None:
        self.conn, self.queue = conn, queue
        self.client: Any = None  # (MetadataClient, QueueTopology) once opened

    def positions(self) -> dict[str, StreamEnd]:
        """The running exchanges that answered; QueueNotFoundError if there is no such queue."""
        config = config_from(self.conn)
        ends = {}
        for xid, data in self._checked(config).snapshot().items():
            if data.get("replay"):
                answer = ask_position(data["replay"], config)
                if answer is not None:
                    ends[xid] = answer
        return ends

    def positions_at(self, at: float) -> dict[str, int]:
        """Per incarnation, running or ended and still served, the last position stored before Unix
        time `at` (startingTimestamp), asked with `position_at` (protocol 5.6) as the Subscriber
        does; one that did not answer is left out (read from its oldest frame)."""
        config = config_from(self.conn)
        topology = self._checked(config)
        return taken_before(config, topology.snapshot, at, lambda: dict(topology.replicas))

    def copies(self) -> Copies:
        """The queue's ended incarnations still served, per exchange oldest first, each with where
        its copy ends (a `position` request naming it, at the replica or the running exchange that
        lists it: roq.client.subscriber.from_time.earlier_incarnations)."""
        config = config_from(self.conn)
        topology = self._checked(config)
        live, replicas = topology.snapshot(), dict(topology.replicas)
        ended: dict[str, list[StreamEnd]] = {}
        # A replicated exchange whose replica is not running: its copies may come back.
        waiting = {xid for xid, data in live.items() if data.get("replicas") == 2 and xid not in replicas}
        for xid, inc, where in earlier_incarnations(live, replicas):
            endpoint = (live[where].get("replay") if where in live else where) or ""
            copy = ask_position(endpoint, config, inc) if endpoint else None
            if copy is None:
                waiting.add(xid)  # sealing (`running`), busy: asked again at the next trigger
            else:
                ended.setdefault(xid, []).append(copy)
        return Copies({xid: tuple(chain) for xid, chain in ended.items()}, frozenset(waiting))

    def check(self) -> None:
        """QueueNotFoundError unless the queue exists: the sink checks on the driver, before any task."""
        self._checked(config_from(self.conn))

    def close(self) -> None:
        if self.client is not None:
            (metadata, topology), self.client = self.client, None
            topology.close()
            metadata.close()

    def _checked(self, config: Any) -> Any:
        """The queue's topology, followed from its first use (QueueNotFoundError if absent)."""
        from roq.client.metadata import MetadataClient
        from roq.client.topology import QueueTopology
        if self.client is None:
            metadata = MetadataClient(config)
            try:
                self.client = (metadata, QueueTopology(metadata, self.queue))
            except BaseException:
                metadata.close()
                raise
        topology = self.client[1]
        topology.check_exists()
        return topology

    def __getstate__(self) -> dict[str, Any]:
        return {"conn": self.conn, "queue": self.queue, "client": None}


def ask_position(endpoint: str, config: Any, incarnation: str = "") -> StreamEnd | None:
    """Where the running stream at `endpoint` stands, or with `incarnation`, where that ended
    incarnation's stored copy ends (protocol 5.2; a replica seals it). None: no usable answer
    (none in time, `running`, `unknown_incarnation`)."""
    from roq import protocol
    sock = _socket(config)
    try:
        sock.connect(endpoint)
        sock.send(protocol.encode_position_request(1, (), incarnation))
        if not sock.poll(FETCH_TIMEOUT_MS):
            log.warning("exchange at %s did not answer a position request", endpoint)
            return None
        try:
            answer = protocol.decode_replay_reply(sock.recv(), protocol.MAX_CONTROL_FRAME)
        except protocol.ProtocolError:  # ReplayRefused included
            return None
        if not isinstance(answer, protocol.StreamPosition) or incarnation not in ("", answer.incarnation):
            return None
        return StreamEnd(answer.incarnation, answer.next_pos - 1, answer.oldest, endpoint)
    finally:
        sock.close(linger=0)


def fetch_deliveries(exchange: str, replay: str, incarnation: str, after: int, upto: int,
                     topics: tuple[bytes, ...], conn: dict[str, str], fail_on_loss: bool) -> Iterator[Any]:
    """(routing topic, roq.protocol.Delivery) of the frames after < pos <= upto, page by page, each
    with only the messages of `topics` (none: every message)."""
    from roq import protocol
    sock = _socket(config_from(conn) if conn else None)
    sock.connect(replay)
    try:
        request_id = 0
        while after < upto:
            request_id += 1
            sock.send(protocol.encode_fetch(request_id, incarnation, after, upto + 1, list(topics), PAGE_BYTES))
            if not sock.poll(FETCH_TIMEOUT_MS):
                raise TimeoutError(f"exchange {exchange} did not answer a fetch in {FETCH_TIMEOUT_MS / 1000:.0f}s")
            reply, *parts = sock.recv_multipart(copy=False)  # large payloads' parts follow a page (protocol 5.1)
            page = protocol.decode_replay_reply(reply.bytes, 1 << 30, parts)
            if not isinstance(page, protocol.Frames) or page.request_id != request_id:
                continue
            if page.oldest > after + 1 and after > 0 and fail_on_loss:
                raise RuntimeError(f"exchange {exchange}: positions {after + 1}..{page.oldest - 1} left its "
                                   "retention before this query read them (failOnDataLoss)")
            for topic, body in page.frames:
                # A frame of many topics may hold messages of other topics too: only ours count.
                delivery = protocol.decode_delivery(body).matching(topic, tuple(topics))
                if delivery is not None:
                    yield topic, delivery
            after = upto if page.done else max(after + 1, page.scanned_to)
    finally:
        sock.close(linger=0)


def walk_messages(exchange: str, end: StreamEnd, after: int, skip: int, upto: int, budget: int,
                  topics: tuple[bytes, ...], conn: dict[str, str]) -> tuple[int, int, int]:
    """From (after, skip) take at most `budget` messages of the frames up to `upto`:
    the (pos, msgs) reached and how many were taken. The driver counts them here, fetching
    the frames once more, because a frame holds a batch of messages of unknown size."""
    from roq.errors import RoqError
    taken = 0
    try:
        for _topic, delivery in fetch_deliveries(exchange, end.replay, end.inc, after, upto, topics, conn, False):
            already = skip if delivery.pos == after + 1 else 0
            count = len(delivery.seqs) - already
            if taken + count > budget:
                return delivery.pos - 1, already + budget - taken, budget
            taken += count
    except (TimeoutError, OSError, RoqError) as exc:  # busy, restarted: counted at the next trigger
        log.warning("exchange %s: could not count messages for maxOffsetsPerTrigger (%s): not advanced", exchange, exc)
        return after, skip, 0
    return upto, 0, taken


def _socket(config: Any) -> Any:
    import zmq

    from roq.security import secure_client
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    if config is not None:
        secure_client(sock, config)
    return sock
