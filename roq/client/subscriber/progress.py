"""What a subscriber's application has taken: the checkpoint it resumes from.

The I/O thread hands messages over; the application takes them (from the inbox, or in a callback
that returned). Only what was taken goes into the checkpoint, so a resume never skips a message
the application did not get: a frame still partly in the inbox is read again. A durable
subscriber saves the checkpoint to its file (`save`); `Subscriber.position()` returns it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from roq import protocol
from roq.client.subscriber.checkpoint import Checkpoint, save_checkpoint
from roq.client.subscriber.messages import Message
from roq.client.subscriber.streams import StreamSet

log = logging.getLogger(__name__)


class Progress:
    def __init__(self, taken: Checkpoint, streams: StreamSet, path: Path | None, callbacks: bool) -> None:
        """`path`: where a durable subscriber saves (None: not saved); `callbacks`: messages are
        taken by a callback on the I/O thread (not from the inbox)."""
        self.taken = taken
        self.path = path
        self._streams = streams
        self._callbacks = callbacks
        self._lock = threading.Lock()
        # Iterator style: incarnation → {position: messages of that frame still in the inbox}. A saved
        # checkpoint never passes a frame the application has not taken all of.
        self._in_inbox: dict[str, dict[int, int]] = {}

    def queued(self, incarnation: str, pos: int, count: int) -> None:
        """Iterator style: `count` messages of a frame go to the inbox (before the first is put)."""
        with self._lock:
            in_inbox = self._in_inbox.setdefault(incarnation, {})
            in_inbox[pos] = in_inbox.get(pos, 0) + count

    def took(self, msg: Message) -> None:
        """Iterator style: the application took `msg` from the inbox."""
        with self._lock:
            self.taken.seen(msg.publisher).add(msg.seq)
            if not msg.incarnation:
                return
            in_inbox = self._in_inbox.get(msg.incarnation)
            left = in_inbox.pop(msg.pos, 1) - 1 if in_inbox is not None else 0
            if left > 0:  # re-read that frame on resume: the application has not taken all of it
                assert in_inbox is not None
                in_inbox[msg.pos] = left
                self.taken.advance(msg.incarnation, msg.pos - 1)
                return
            if in_inbox is not None and not in_inbox:
                del self._in_inbox[msg.incarnation]
            self.taken.advance(msg.incarnation, msg.pos)

    def took_frame(self, d: protocol.Delivery, fresh: range | list[int]) -> None:
        """Callback style: the application took these messages of one frame."""
        with self._lock:
            seen = self.taken.seen(d.publisher)
            seqs = d.seqs
            consecutive = isinstance(fresh, range) and seqs[-1] - seqs[0] == len(seqs) - 1
            if not (consecutive and seen.add_run(seqs[0], seqs[-1])):
                for i in fresh:
                    seen.add(seqs[i])
            self.taken.advance(d.incarnation, d.pos)

    def started(self, incarnation: str, pos: int) -> None:
        """I/O thread: the stream of `incarnation` starts after `pos` for us."""
        with self._lock:
            self.taken.advance(incarnation, pos)
        self.save(quiet=True)  # a durable name exists from its first sync, not its first message

    def to_json(self, quiet: bool, max_publishers: int | None = None, max_runs: int | None = None) -> dict[str, Any]:
        """The checkpoint as `Subscriber.position()` returns it. `quiet`: called where the I/O thread
        is not handing anything over (on it, or after it stopped), so the streams' floors can be
        brought up to date first."""
        if quiet:
            self._streams.refresh_floors()
        with self._lock:
            data = self.taken.to_json(max_publishers, max_runs)
            data["streams"] = self._resume_points(quiet)
        data["start_at_sync"] = sorted(set(self._streams.start_at_sync))  # not synced yet: started "now"
        return data

    def _resume_points(self, quiet: bool) -> dict[str, int]:
        """Per incarnation, where a resume starts (lock held): every frame of our prefixes at or below
        it was handed over (no hole open below it) and taken by the application in full. Frames of
        other topics count as handled, so a subscriber to a few topics is not behind on the rest."""
        points = dict(self.taken.streams)
        for inc, stream in list(self._streams.streams.items()):
            if not stream.known:
                continue  # not synced yet: nothing handled from it
            handled = stream.floor
            in_inbox = self._in_inbox.get(inc)
            if in_inbox:
                handled = min(handled, min(in_inbox) - 1)
            elif not quiet and self._callbacks:
                handled = min(handled, points.get(inc, handled))  # a callback may still be running
            points[inc] = handled
        return points

    def save(self, quiet: bool = False) -> dict[str, Any] | None:
        """A durable subscriber's checkpoint, saved to its file (kept going if the file cannot be)."""
        if self.path is None:
            return None
        data = self.to_json(quiet)
        try:
            save_checkpoint(self.path, data)
        except OSError as exc:
            log.warning("could not save the subscriber position to %s: %s", self.path, exc)
        return data
