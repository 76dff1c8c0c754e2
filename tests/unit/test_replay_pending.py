"""A fetch over frames that wait unwritten in the segment store (its disk refuses writes, or the
writer is behind) while the memory tail let them go: the exchange answers `pending` (protocol
section 5.3) rather than counting them lost, and RoQ's client asks again; once the store has
written them a fetch gets every one, no gap. Real sockets, a real segment store whose writer is
held back (frames appended, not flushed), the subscriber's own replay client."""

from __future__ import annotations

import dataclasses
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from exchange.replay import ReplayServer, replay_socket
from exchange.retention import Retention
from exchange.segment_store import SegmentStore, StoreLimits
from exchange.store_hooks import stored_frame
from roq import protocol
from roq.client.subscriber.replay import ReplayClient
from roq.client.subscriber.streams import FetchFailed
from roq.config import ClientConfig, Config, ExchangeConfig

pytestmark = pytest.mark.timeout(60)

INC = "x1.000000007"
FRAMES = 40
WRITTEN = 10  # the store wrote the first 10; the rest wait


class Served:
    """A stored incarnation served on a real replay socket from a 2 KB memory tail and a store."""

    def __init__(self, ctx: zmq.Context, directory: Path) -> None:
        self.memory = Retention(3600.0, 2_000)
        self.store = SegmentStore(directory, StoreLimits(segment_bytes=4096, index_every=256))
        for i in range(FRAMES):
            body = protocol.encode_delivery("x1", INC, i + 1, [], "p-1", 0, [i + 1], [b"m%d" % i + b"." * 200])
            pos = self.memory.add(b"t", body, 1)
            self.store.append(stored_frame(pos, float(i), b"t", body, 1))
            if pos == WRITTEN:
                assert self.store.flush()
        assert self.memory.served_from > WRITTEN + 1, "the memory let unwritten frames go"
        sock = replay_socket(ctx)
        self.endpoint = f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.server = ReplayServer(sock, ExchangeConfig(), lambda name, n: None, archives={INC: self.memory},
                                   store_of=lambda inc: self.store if inc == INC else None)
        self.lock = threading.Lock()  # the store is the server thread's while it runs
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if self.server.sock.poll(20):
                with self.lock:
                    self.server.drain()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.server.sock.close(linger=0)
        self.store.close()


@pytest.fixture
def served() -> Iterator[Served]:
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as directory:
        serving = Served(ctx, Path(directory))
        yield serving
        serving.close()
    ctx.destroy(linger=0)


def fetch_all(client: ReplayClient, endpoint: str) -> tuple[list[int], int]:
    """Positions fetched after 0 and the messages said lost."""
    positions, lost = [], 0
    for page in client.fetch(endpoint, INC, 0, FRAMES + 1, b""):
        positions += [protocol.decode_delivery(body).pos for _, body in page.frames]
        lost += page.lost
    return positions, lost


def test_frames_waiting_to_be_written_are_fetched_once_written_never_counted_lost(served: Served) -> None:
    config = dataclasses.replace(Config(), client=ClientConfig(fetch_timeout=0.5))
    ctx = zmq.Context()
    client = ReplayClient(config, lambda: {}, lambda: False)
    client.bind(ctx)
    try:
        taken: list[int] = []
        with pytest.raises(FetchFailed, match="pending"):  # the hole stays open: asked again later
            for page in client.fetch(served.endpoint, INC, 0, FRAMES + 1, b""):
                assert page.lost == 0, "frames waiting to be written counted lost"
                taken += [protocol.decode_delivery(body).pos for _, body in page.frames]
        assert taken == list(range(1, WRITTEN + 1)), "what the store wrote, up to the first waiting frame"
        with served.lock:
            assert served.store.flush(), "the writer catches up"
        positions, lost = fetch_all(client, served.endpoint)
        assert positions == list(range(1, FRAMES + 1))
        assert lost == 0
    finally:
        client.close()
        ctx.destroy(linger=0)
