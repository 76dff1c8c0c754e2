"""Subscriber: receives every message of its topics from all exchanges of a queue.

One SUB socket, owned by the I/O thread (roq.client.subscriber.receiver), follows every running
exchange; the stream rules (roq.client.subscriber.streams) fetch what was dropped from retention,
and the checkpoint (roq.client.subscriber.checkpoint) hands each message over once. Durable
subscribers save it and resume from it (roq.client.subscriber.progress). Iterator, callback and
batch styles; the hand-off queue is bounded, so a slow application slows the socket. How it all
fits: docs/client.md "How a subscriber works".
"""

from __future__ import annotations

import logging
import queue as queue_module
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any

from roq import protocol
from roq.client.headers import EMPTY_HEADERS
from roq.client.lifecycle import ClientLifecycle
from roq.client.metadata import MetadataClient
from roq.client.stats import SubscriberStats
from roq.client.subscriber.checkpoint import Checkpoint, checkpoint_file, load_checkpoint
from roq.client.subscriber.copies import StoredCopies
from roq.client.subscriber.from_time import earlier_incarnations, taken_before, unix_time
from roq.client.subscriber.messages import Message, MessageBatch, frame_batch, topic_texts
from roq.client.subscriber.progress import Progress
from roq.client.subscriber.receiver import SubscriberReceiver
from roq.client.subscriber.replay import ReplayClient
from roq.client.subscriber.streams import Stream, StreamSet
from roq.client.topology import QueueTopology
from roq.config import Config
from roq.errors import RefusedError, UserError
from roq.names import check_subscriber_name, check_topic, topic_text
from roq.security import load_keys

log = logging.getLogger(__name__)

HANDOFF_LIMIT = 100_000  # messages buffered between the I/O thread and the application
START_POINTS = ("now", "beginning")  # where a subscriber without a position starts
PROGRESS_REFRESH = 30.0  # a durable subscriber re-reports an unchanged position this often (s)


class Subscriber(ClientLifecycle):
    def __new__(cls, *args: Any, group: str | None = None, **kwargs: Any) -> Any:
        """Deprecated: `group="name"` made this a consumer group member; use GroupMember."""
        if group is not None:
            warnings.warn("Subscriber(group=...) is deprecated: use roq.client.GroupMember(...)", DeprecationWarning,
                          stacklevel=2)
            from roq.client.group_member import GroupMember
            fanout_only = sorted(set(kwargs) & {"durable", "position", "start", "batch_callback"})
            if fanout_only:
                raise UserError(f"a consumer group member takes no {', '.join(fanout_only)}: the group keeps its "
                                "own state (docs/work-queues.md)")
            return GroupMember(*args, group=group, **kwargs)
        return super().__new__(cls)

    def __init__(self, queue: str, config: Config, topics: Iterable[str | bytes] = (),
                 metadata: MetadataClient | None = None, callback: Callable[[Message], None] | None = None,
                 durable: str | None = None, position: dict[str, Any] | None = None,
                 batch_callback: Callable[[MessageBatch], None] | None = None, start: str | datetime = "now",
                 inbox_limit: int = HANDOFF_LIMIT, group: None = None) -> None:
        """`callback` gets one Message at a time, `batch_callback` a MessageBatch per frame (the
        fastest way to consume); both run on the I/O thread. Give at most one: ValueError otherwise.

        `start`: where a subscriber without a position (none given, no saved one under its durable
        name) begins: "now" (what is published from now on), "beginning" (everything the
        exchanges still retain, ended incarnations that a restarted exchange serves from disk or
        a replica still holds included, then on), or a `datetime` with a time zone (every frame
        those stored at or after it, then on: roq/client/subscriber/from_time.py). A position, given or
        saved, always wins.

        `inbox_limit`: messages held for the iterator style before the I/O thread waits (and the
        socket, then the exchange, hold the rest)."""
        if callback is not None and batch_callback is not None:
            raise ValueError("give callback or batch_callback, not both")
        at = unix_time(start) if isinstance(start, datetime) else None
        if at is None and start not in START_POINTS:
            raise ValueError(f"start must be one of {', '.join(START_POINTS)}, not {start!r}")
        self.config = config
        load_keys(config.security)  # a missing or unreadable key fails here, not at the first connect
        self.queue = queue
        self.topics = [check_topic(t) for t in topics] or [b""]
        self.callback = callback
        self.batch_callback = batch_callback
        self.id = uuid.uuid4().hex
        self._sync_topic = protocol.sync_topic(self.id)  # our private marker (docs/protocol.md)
        saved = Checkpoint.from_json(position) if position is not None else None
        self.durable = durable
        self._reported: dict[str, tuple[int, float]] = {}  # xid → (pos, when) last reported
        path = None
        if durable is not None:
            path = checkpoint_file(config.client.state_dir, queue, check_subscriber_name(durable))
            if saved is None:
                saved = load_checkpoint(path)
        self.resumed = saved is not None
        taken = saved or Checkpoint()  # what the application has taken (saved, returned by position())
        self._handed = taken.copy()  # what the I/O thread has handed over (dedup)
        self._replay = ReplayClient(config, self.topology_snapshot, lambda: self._closed, lambda xid: self._copies(xid))
        self._streams = StreamSet(self.topics, self._replay, self._hand_over)
        for inc, pos in taken.streams.items():
            self._streams.resume(inc, pos)
        self._progress = Progress(taken, self._streams, path, callback is not None or batch_callback is not None)
        self.topics = self._streams.prefixes  # subscribed as normalised: "a" covers "ab"
        self._use_metadata(config, metadata)
        self._copies = StoredCopies(queue, self._replicas, self.topology_snapshot)
        self._inbox: queue_module.Queue[Message] = queue_module.Queue(inbox_limit)
        self.received = 0
        self.duplicates = 0
        self.recovered_frames = 0  # frames fetched from retention and handed over
        self.callback_errors = 0
        self._closed = False
        try:
            self._receiver = SubscriberReceiver(queue, config, self.metadata, self.topics, self._sync_topic,
                                                self._streams, self._replay, self._save_tick if path else None)
        except Exception:
            self._release_metadata()
            raise
        # A new subscriber starts at the sync point of the exchanges running now (start="now"); an
        # exchange that appears later is read from the start of its retention. What came before a
        # sync point goes into the position as taken: a durable subscriber never replays history
        # from before it existed, even from an exchange it has not yet received anything from.
        self.start = "resume" if self.resumed else "time" if at is not None else str(start)
        self._streams.started = self._progress.started
        running = {live["incarnation"] for live in self.topology.snapshot().values()
                   if isinstance(live.get("incarnation"), str)}
        self._streams.start_at_sync = (set(taken.start_at_sync) & running if self.resumed
                                       else running if self.start == "now" else set())
        if self.start == "time" and at is not None:
            for incarnation, pos in taken_before(config, self.topology.snapshot, at, self._replicas).items():
                self._streams.resume(incarnation, pos)
                self._progress.started(incarnation, pos)
        if self.start in ("beginning", "time"):
            self._read_archived()
        self._receiver.start()

    def _read_archived(self) -> None:
        """From the beginning or a time, the ended incarnations still served are read too: the
        earlier ones a running exchange serves (a restarted exchange's segment store or journal)
        and those a replica stores (an exchange's host lost with its disk): each as an ended stream,
        drained from the copy like any ended incarnation, oldest first."""
        for xid, incarnation, _ in earlier_incarnations(self.topology.snapshot(), self._replicas()):
            if incarnation not in self._streams.streams:  # from a time: started where it begins
                self._streams.stream(incarnation, xid)
                # In the position from now on, so a resume before its first frame still reads it.
                self._progress.started(incarnation, 0)
            self._streams.end(incarnation)

    # ------------------------------------------------------------ API

    @property
    def topology(self) -> QueueTopology:
        return self._receiver.topology

    @property
    def connected(self) -> set[str]:
        """Ids of the exchanges the socket is connected to."""
        return self._receiver.connected

    @property
    def gaps(self) -> int:
        """Messages of our topics that retention no longer held when we fetched them."""
        return self._streams.gaps

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after `timeout`. Raises QueueNotFoundError when the queue
        has been deleted (and not created again) for a few seconds and nothing is left to take, and
        RefusedError when every exchange of the queue refuses our handshake (no subscribe right, an
        unknown key: libzmq keeps trying, so a later call may succeed once the cause is fixed)."""
        try:
            msg = self._inbox.get(timeout=timeout)
        except queue_module.Empty:
            self.topology.check_exists()
            refusal = self._receiver.refusal()
            if refusal is not None:
                raise RefusedError(refusal)
            return None
        self._progress.took(msg)
        return msg

    def __iter__(self) -> Iterator[Message]:
        while not self._closed:
            msg = self.receive(timeout=0.2)
            if msg is not None:
                yield msg

    def position(self, max_publishers: int | None = None, max_runs: int | None = None) -> dict[str, Any]:
        """Where this subscriber would resume (its checkpoint): pass it back as `position=`. With
        `max_publishers` or `max_runs`, bounded as `Checkpoint.to_json` says (the HTTP gateway's
        resume tokens)."""
        return self._progress.to_json(quiet=False, max_publishers=max_publishers, max_runs=max_runs)

    def stats(self) -> SubscriberStats:
        streams = self._streams
        return SubscriberStats(received=self.received, duplicates=self.duplicates, gaps=streams.gaps,
                               unknown_gaps=streams.unknown_gaps, recovered_frames=self.recovered_frames,
                               fetches=streams.fetches, fetch_failures=streams.fetch_failures,
                               resyncs=streams.resyncs, position_checks=streams.position_checks,
                               callback_errors=self.callback_errors, exchanges=len(self.connected))

    def wait_connected(self, count: int | None = None, timeout: float = 10.0) -> None:
        """Wait until the subscriptions are live on `count` exchanges (default: all running ones)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = self.topology.snapshot()
            want = count if count is not None else len(live)
            if want and sum(1 for xid, data in live.items() if self._is_synced(xid, data)) >= want:
                return
            time.sleep(0.02)
        raise TimeoutError(f"subscriptions live on {sorted(self.connected)} after {timeout:.1f}s")

    def _shut_down(self) -> None:
        self._closed = True
        self._receiver.close()
        self._progress.save(quiet=True)  # the I/O thread has stopped

    # ------------------------------------------------------------ the I/O thread's side

    def topology_snapshot(self) -> dict[str, dict[str, Any]]:
        receiver = getattr(self, "_receiver", None)  # None until the constructor made it
        return receiver.topology.snapshot() if receiver is not None else {}

    def _replicas(self) -> dict[str, dict[str, Any]]:
        """The queue's running replicas (exchange id → {replay, incarnation}), as the GCMs tell them."""
        receiver = getattr(self, "_receiver", None)
        return dict(receiver.topology.replicas) if receiver is not None else {}

    def _is_synced(self, xid: str, live: dict[str, Any]) -> bool:
        inc = live.get("incarnation")
        if not inc:
            return xid in self.connected
        stream = self._streams.streams.get(inc)
        return stream is not None and stream.synced

    def _save_tick(self) -> None:
        """I/O thread, every client.position_save_interval: save, and tell the exchanges."""
        saved = self._progress.save(quiet=True)
        if saved is not None:
            self._report_progress(saved["streams"])

    def _report_progress(self, taken: dict[str, int], now: float | None = None) -> None:
        """Tell each running exchange how far this durable subscriber took its stream (`taken`: the
        saved resume points), when that moved (or every PROGRESS_REFRESH): `roq stats` and /metrics
        show the lag."""
        assert self.durable is not None
        now = time.monotonic() if now is None else now
        for xid, live in self.topology_snapshot().items():
            inc = live.get("incarnation")
            if not isinstance(inc, str) or not inc or inc in self._streams.start_at_sync:
                continue  # where it starts for us is not known before its sync
            pos = taken.get(inc, 0)
            last = self._reported.get(xid)
            if last is None or last[0] != pos or now - last[1] >= PROGRESS_REFRESH:
                self._replay.report(xid, self.durable, inc, pos)
                self._reported[xid] = (pos, now)

    # ------------------------------------------------------------ the I/O thread's hand-over

    def _hand_over(self, stream: Stream, topic: bytes, d: protocol.Delivery, recovered: bool) -> None:
        """Drop what was handed over before (by publisher and sequence), pass on the rest."""
        seqs = d.seqs
        if not seqs:
            return
        seen = self._handed.seen(d.publisher)
        fresh: range | list[int]
        # A run only when consecutive: a frame of many topics may leave out the seqs of other frames.
        if seqs[-1] - seqs[0] == len(seqs) - 1 and seen.add_run(seqs[0], seqs[-1]):
            fresh = range(len(seqs))
        else:
            fresh = [i for i, seq in enumerate(seqs) if seen.add(seq)]
        self.duplicates += len(seqs) - len(fresh)
        if not fresh:
            return
        if recovered:
            self.recovered_frames += 1
        self.received += len(fresh)
        if self.batch_callback:
            self._hand_over_batch(self.batch_callback, topic, d, fresh)
            return
        names = _topic_names(topic, d)
        payloads, publisher, xid, sent_ns, inc, pos = d.payloads, d.publisher, d.exchange, d.sent_ns, \
            d.incarnation, d.pos
        headers = d.headers() if d.attrs else None
        if self.callback:
            callback = self.callback
            for i in fresh:
                try:
                    callback(Message(names[i], payloads[i], publisher, seqs[i], xid, sent_ns, inc, pos,
                                     headers[i] or EMPTY_HEADERS if headers else EMPTY_HEADERS))
                except Exception:
                    self.callback_errors += 1
                    log.exception("subscriber callback failed on %s/%d (the message counts as taken)",
                                  publisher, seqs[i])
            self._progress.took_frame(d, fresh)
            return
        self._progress.queued(inc, pos, len(fresh))  # the frame is taken when its last message is
        for i in fresh:
            msg = Message(names[i], payloads[i], publisher, seqs[i], xid, sent_ns, inc, pos,
                          headers[i] or EMPTY_HEADERS if headers else EMPTY_HEADERS)
            while not self._closed:
                try:
                    self._inbox.put(msg, timeout=0.2)
                    break
                except queue_module.Full:
                    continue

    def _hand_over_batch(self, callback: Callable[[MessageBatch], None], topic: bytes, d: protocol.Delivery,
                         fresh: range | list[int]) -> None:
        """Batch callback style: the frame's fresh messages in one call, whatever their topics (one
        frame, one position: docs/protocol.md 4.4). An exception in the callback is logged and
        counted, and the whole batch counts as taken (as in callback style)."""
        batch = frame_batch(topic, d, fresh)
        try:
            callback(batch)
        except Exception:
            self.callback_errors += 1
            log.exception("subscriber batch callback failed on %s/%d..%d (the batch counts as taken)",
                          d.publisher, batch.seqs[0], batch.seqs[-1])
        self._progress.took_frame(d, fresh)


def _topic_names(topic: bytes, d: protocol.Delivery) -> list[str]:
    """Each message's topic as text (one conversion per distinct topic)."""
    if d.topics is None:
        return [topic_text(topic)] * len(d.seqs)
    return topic_texts(d.topics)
