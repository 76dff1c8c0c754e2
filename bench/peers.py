"""The systems RoQ is compared with, behind roq.tools.bench's adapter interface.

Each is used the way its Python client is normally used for pub/sub, with the
batching its client offers, and with limits raised so that nothing is dropped
for a slow subscriber (so throughput is not bought with loss):
* raw ZeroMQ: PUB → SUB, one message per send, no broker, no high-water mark;
  and batched by hand (one msgpack list of payloads per send), for reference;
  for several publishers into one subscriber, the other way round (PUB connect
  → SUB bind, `ZmqFanInAdapter`);
* python-hop: raw ZeroMQ through one minimal Python forwarding process
  (`bench/hop.py`): the latency floor of any broker written in Python;
* NATS: nats-py (asyncio), core publish/subscribe, pending limits lifted;
* Redis: redis-py PUBLISH (pipelined by 100 when unpaced), SUBSCRIBE;
* RabbitMQ: pika, a fanout exchange, one exclusive auto-ack queue per
  subscriber, no publisher confirms.

Disk-retained peers (what a queue with a storage policy is compared with; not in the default run):
* NATS JetStream (`nats-jetstream`): a file-storage stream over the bench subjects, every publish
  acknowledged by the server (which acknowledges once stored, before fsync: its default
  sync_interval), up to WINDOW acks awaited at once; an ordered push consumer of new messages;
* RabbitMQ quorum queue with publisher confirms (`rabbitmq-quorum`): persistent messages to a
  durable quorum queue (its Raft log is fsynced before a confirm), up to WINDOW unconfirmed at once
  over pika's asynchronous connection; the subscriber acks in batches (`multiple`).

Raw ZeroMQ and NATS also take settings["topics"] = N (roq.tools.bench.topic_count):
publishers spread messages round-robin over N topics, subscribers take them by prefix.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from roq.tools.bench import Adapter, BatchAdapter, pace, topic_count, topic_names

SUBJECT = "bench"


class ZmqAdapter(Adapter):
    """settings: {"endpoint": "tcp://127.0.0.1:port"}; the publisher binds, subscribers connect.

    Over many topics (settings["topics"] > 1) each frame is the topic, then the payload: the SUB
    socket filters on the prefix b"bench/", and strips the topic (one width) before the harness
    reads the payload."""

    name = "zeromq"
    SUBSCRIBER_ATTACH = "connect"  # how the subscriber's socket reaches settings["endpoint"]

    def subscribe(self, on_payload: Callable[[bytes], None]) -> None:
        import zmq
        self.context = zmq.Context()
        sock = self.context.socket(zmq.SUB)
        sock.linger = 0
        sock.rcvhwm = 0
        many = topic_count(self.settings) > 1
        sock.setsockopt(zmq.SUBSCRIBE, b"bench/" if many else b"")
        getattr(sock, self.SUBSCRIBER_ATTACH)(self.settings["endpoint"])
        self._stop = threading.Event()
        receive = _without_topic(sock.recv) if many else sock.recv

        def loop() -> None:
            recv = receive
            while not self._stop.is_set():
                if sock.poll(100):
                    while True:
                        try:
                            on_payload(recv(zmq.NOBLOCK))
                        except zmq.Again:
                            break
            sock.close()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    # The publisher's socket: type, bind or connect, and the settings key of its endpoint.
    PUBLISHER = ("PUB", "bind", "endpoint")

    def open_publisher(self) -> None:
        import zmq
        kind, attach, endpoint = self.PUBLISHER
        self.context = zmq.Context()
        self.sock = self.context.socket(getattr(zmq, kind))
        self.sock.linger = 1000
        self.sock.sndhwm = 0
        getattr(self.sock, attach)(self.settings[endpoint])
        self.publish = self.sock.send
        topics = topic_count(self.settings)
        if topics > 1:  # each frame starts with the next topic (a copy of the payload per send)
            send, turn = self.sock.send, itertools.cycle([t.encode() for t in topic_names(topics)])
            self.publish = lambda payload: send(next(turn) + payload)

    def close(self) -> None:
        if hasattr(self, "_thread"):
            self._stop.set()
            self._thread.join(5)
        if hasattr(self, "sock"):
            self.sock.close()
        if hasattr(self, "context"):
            self.context.term()


def _without_topic(recv: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """recv() of frames that start with a topic of topic_names(): the payload after it."""
    width = len(topic_names(1)[0])
    return lambda flags: recv(flags)[width:]


class ZmqFanInAdapter(ZmqAdapter):
    """settings: {"endpoint": ...}: several publishers into one subscriber, the ZeroMQ way round
    for that: the subscriber binds, every publisher connects (PUB connect → SUB bind); same payloads.

    A publisher's socket is an XPUB (a PUB that also hands up the subscriptions it receives), and
    it waits for the subscriber's subscription before it sends anything: a PUB drops what it sends
    before then, and the harness starts the measured messages once the subscriber has seen a
    warm-up from one publisher, not from every one."""

    name = "zeromq-fanin"
    PUBLISHER = ("XPUB", "connect", "endpoint")
    SUBSCRIBER_ATTACH = "bind"
    SUBSCRIPTION_WAIT_MS = 30_000

    def open_publisher(self) -> None:
        super().open_publisher()
        if not self.sock.poll(self.SUBSCRIPTION_WAIT_MS):
            raise TimeoutError(f"no subscriber subscribed at {self.settings['endpoint']} "
                               f"in {self.SUBSCRIPTION_WAIT_MS / 1000:.0f}s")
        self.sock.recv()  # the subscription


class ZmqBatchAdapter(ZmqAdapter, BatchAdapter):
    """Raw ZeroMQ, batched by hand: each send is one msgpack list of payloads (what RoQ does on the wire)."""

    name = "zeromq-batch"

    def subscribe_batches(self, on_payloads: Callable[[list[bytes]], None]) -> None:
        import msgpack
        self.subscribe(lambda frame: on_payloads(msgpack.unpackb(frame)))

    def open_publisher(self) -> None:
        import msgpack
        super().open_publisher()
        send, pack = self.sock.send, msgpack.packb
        self.publish = lambda payload: send(pack([payload]))
        self.publish_many = lambda payloads: send(pack(payloads))


class PythonHopAdapter(ZmqAdapter):
    """settings: {"front": ..., "endpoint": ...}: PUSH → bench/hop.py (PULL → PUB) → SUB, one
    message per send. The subscriber side is raw ZeroMQ's; only the hop in between is added."""

    name = "python-hop"
    PUBLISHER = ("PUSH", "connect", "front")


class NatsAdapter(Adapter):
    """settings: {"url": "nats://127.0.0.1:port"}. Over many topics (settings["topics"] > 1) the
    subjects are bench.00000, bench.00001, ..., and subscribers take `bench.>`."""

    name = "nats"

    def subscribe(self, on_payload: Callable[[bytes], None]) -> None:
        import nats
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        subject = "bench.>" if topic_count(self.settings) > 1 else SUBJECT

        async def start() -> None:
            self.nc = await nats.connect(self.settings["url"], pending_size=1 << 30)

            async def handler(msg: Any) -> None:
                on_payload(msg.data)

            await self._subscribe(subject, handler)
            await self.nc.flush()
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.create_task(start())
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not ready.wait(15):
            raise TimeoutError("could not subscribe to NATS")

    async def _subscribe(self, subject: str, handler: Callable[[Any], Awaitable[None]]) -> None:
        await self.nc.subscribe(subject, cb=handler, pending_msgs_limit=10_000_000, pending_bytes_limit=1 << 30)

    def open_publisher(self) -> None:
        import nats
        self._loop = asyncio.new_event_loop()
        self.nc = self._loop.run_until_complete(nats.connect(self.settings["url"], pending_size=1 << 30))
        self._loop.run_until_complete(self._prepare_publisher())
        count = topic_count(self.settings)
        self._subjects: Iterator[str] | None = itertools.cycle(topic_names(count, ".")) if count > 1 else None

    async def _prepare_publisher(self) -> None:
        """What a publisher sets up once connected (JetStream: its stream)."""

    def publish(self, payload: bytes) -> None:
        subject = next(self._subjects) if self._subjects else SUBJECT
        self._loop.run_until_complete(self.nc.publish(subject, payload))

    def _burst(self, make_payload: Callable[[], bytes]) -> Callable[[int], Awaitable[None]]:
        """A coroutine function that publishes n messages: to one subject, or to the subjects in
        turn (a loop of its own, so that the one-subject loop does no more than before)."""
        publish, subjects = self.nc.publish, self._subjects

        async def one_subject(n: int) -> None:
            for _ in range(n):
                await publish(SUBJECT, make_payload())

        async def in_turn(n: int) -> None:
            assert subjects is not None
            for _ in range(n):
                await publish(next(subjects), make_payload())

        return one_subject if subjects is None else in_turn

    def send_all(self, make_payload: Callable[[], bytes], count: int, rate: float) -> None:
        burst = self._burst(make_payload)

        async def send() -> None:
            if rate <= 0:
                await burst(count)
                return
            start, sent = time.monotonic(), 0
            while sent < count:
                due = min(count, int((time.monotonic() - start) * rate) + 1)
                if due <= sent:
                    await self.nc.flush()
                    await asyncio.sleep(min(0.0002, (sent + 1 - due) / rate))
                    continue
                await burst(due - sent)
                sent = due

        self._loop.run_until_complete(send())

    def drain(self) -> int:
        self._loop.run_until_complete(self.nc.flush())
        return -1

    def close(self) -> None:
        if not hasattr(self, "nc"):
            return
        if hasattr(self, "_thread"):
            asyncio.run_coroutine_threadsafe(self.nc.close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        else:
            self._loop.run_until_complete(self.nc.close())


class JetStreamAdapter(NatsAdapter):
    """settings: {"url": ...} of a nats-server started with JetStream (bench/servers.py nats_jetstream)."""

    name = "nats-jetstream"
    STREAM = "BENCH"
    WINDOW = 1000  # publish acknowledgements awaited at once

    async def _ensure_stream(self) -> Any:
        from nats.js.api import StorageType, StreamConfig
        js = self.nc.jetstream()
        await js.add_stream(StreamConfig(name=self.STREAM, subjects=[SUBJECT, f"{SUBJECT}.>"],
                                         storage=StorageType.FILE))  # the same config again is no change
        return js

    async def _subscribe(self, subject: str, handler: Callable[[Any], Awaitable[None]]) -> None:
        from nats.js.api import DeliverPolicy
        js = await self._ensure_stream()
        await js.subscribe(subject, cb=handler, ordered_consumer=True, deliver_policy=DeliverPolicy.NEW,
                           pending_msgs_limit=10_000_000, pending_bytes_limit=1 << 30)

    async def _prepare_publisher(self) -> None:
        self.js = await self._ensure_stream()

    def publish(self, payload: bytes) -> None:
        subject = next(self._subjects) if self._subjects else SUBJECT
        self._loop.run_until_complete(self.js.publish(subject, payload))

    def _burst(self, make_payload: Callable[[], bytes]) -> Callable[[int], Awaitable[None]]:
        """n acknowledged publishes, WINDOW in flight at a time."""
        js, subjects = self.js, self._subjects

        async def burst(n: int) -> None:
            for start in range(0, n, self.WINDOW):
                await asyncio.gather(*(js.publish(next(subjects) if subjects else SUBJECT, make_payload())
                                       for _ in range(min(self.WINDOW, n - start))))

        return burst


class RedisAdapter(Adapter):
    """settings: {"port": int}."""

    name = "redis"
    PIPELINE = 100

    def subscribe(self, on_payload: Callable[[bytes], None]) -> None:
        import redis
        self.client = redis.Redis(port=self.settings["port"])
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(SUBJECT)
        self._stop = threading.Event()

        def loop() -> None:
            while not self._stop.is_set():
                msg = pubsub.get_message(timeout=0.1)
                if msg is not None:
                    on_payload(msg["data"])
            pubsub.close()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def open_publisher(self) -> None:
        import redis
        self.client = redis.Redis(port=self.settings["port"])

    def publish(self, payload: bytes) -> None:
        self.client.publish(SUBJECT, payload)

    def send_all(self, make_payload: Callable[[], bytes], count: int, rate: float) -> None:
        if rate > 0:
            return super().send_all(make_payload, count, rate)  # one round trip each: lowest latency
        pipe = self.client.pipeline(transaction=False)
        for i in range(count):
            pipe.publish(SUBJECT, make_payload())
            if i % self.PIPELINE == self.PIPELINE - 1:
                pipe.execute()
        pipe.execute()

    def close(self) -> None:
        if hasattr(self, "_thread"):
            self._stop.set()
            self._thread.join(5)
        if hasattr(self, "client"):
            self.client.close()


class RabbitAdapter(Adapter):
    """settings: {"port": int}."""

    name = "rabbitmq"

    def _connect(self) -> Any:
        import pika
        params = pika.ConnectionParameters(host="127.0.0.1", port=self.settings["port"], heartbeat=0)
        connection = pika.BlockingConnection(params)
        channel = connection.channel()
        channel.exchange_declare(SUBJECT, exchange_type="fanout")
        return connection, channel

    def subscribe(self, on_payload: Callable[[bytes], None]) -> None:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                self.connection, channel = self._connect()
                self._consume(channel, on_payload)
                self._channel = channel
                ready.set()
                channel.start_consuming()
                self.connection.close()
            except BaseException as exc:  # reported to the caller below
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]

    def _consume(self, channel: Any, on_payload: Callable[[bytes], None]) -> None:
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.queue_bind(queue, SUBJECT)
        channel.basic_consume(queue, lambda ch, method, props, body: on_payload(body), auto_ack=True)

    def open_publisher(self) -> None:
        self.connection, self.channel = self._connect()

    def publish(self, payload: bytes) -> None:
        self.channel.basic_publish(SUBJECT, "", payload)

    def drain(self) -> int:
        self.connection.process_data_events(0)
        return -1

    def close(self) -> None:
        if hasattr(self, "_thread"):
            self.connection.add_callback_threadsafe(self._channel.stop_consuming)
            self._thread.join(5)
        if hasattr(self, "connection") and self.connection.is_open:
            self.connection.close()


class RabbitQuorumAdapter(RabbitAdapter):
    """settings: {"port": int}. A durable quorum queue bound to the bench exchange, persistent
    messages, publisher confirms with up to WINDOW unconfirmed (pika's SelectConnection in a thread
    of its own: the blocking connection waits for each confirm)."""

    name = "rabbitmq-quorum"
    QUEUE = "bench-quorum"
    WINDOW = 1000  # unconfirmed publishes at once; the consumer's prefetch too

    def _connect(self) -> Any:
        connection, channel = super()._connect()
        channel.queue_declare(self.QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind(self.QUEUE, SUBJECT)
        return connection, channel

    def _consume(self, channel: Any, on_payload: Callable[[bytes], None]) -> None:
        """From the quorum queue, WINDOW unacked at most, one `multiple` ack per tenth of that."""
        channel.basic_qos(prefetch_count=self.WINDOW)
        every, count = self.WINDOW // 10, itertools.count(1)

        def deliver(ch: Any, method: Any, props: Any, body: bytes) -> None:
            on_payload(body)
            if next(count) % every == 0:
                ch.basic_ack(method.delivery_tag, multiple=True)

        channel.basic_consume(self.QUEUE, deliver)

    def open_publisher(self) -> None:
        import pika
        declaring, _ = self._connect()
        declaring.close()
        self._cond = threading.Condition()
        self._sent = self._confirmed = self._nacked = 0
        self._singles: set[int] = set()  # confirmed one by one above _confirmed
        opened = threading.Event()
        self._properties = pika.BasicProperties(delivery_mode=2)

        def on_channel(channel: Any) -> None:
            self._pub = channel
            channel.confirm_delivery(self._on_confirm, callback=lambda _frame: opened.set())

        params = pika.ConnectionParameters(host="127.0.0.1", port=self.settings["port"], heartbeat=0)
        self.connection = pika.SelectConnection(params, on_open_callback=lambda c: c.channel(
            on_open_callback=on_channel))
        self._ioloop = threading.Thread(target=self.connection.ioloop.start, daemon=True)
        self._ioloop.start()
        if not opened.wait(30):
            raise TimeoutError("could not open a confirming channel to RabbitMQ")

    def _on_confirm(self, frame: Any) -> None:
        import pika
        method = frame.method
        with self._cond:
            if isinstance(method, pika.spec.Basic.Nack):
                self._nacked += 1
            if method.multiple:
                self._confirmed = max(self._confirmed, method.delivery_tag)
                self._singles = {tag for tag in self._singles if tag > self._confirmed}
            else:
                self._singles.add(method.delivery_tag)
            while self._confirmed + 1 in self._singles:
                self._confirmed += 1
                self._singles.discard(self._confirmed)
            self._cond.notify_all()

    def _publish_batch(self, payloads: list[bytes]) -> None:
        """Hand `payloads` to the connection's thread once the window has room for them."""
        for start in range(0, len(payloads), self.WINDOW):
            piece = payloads[start:start + self.WINDOW]
            with self._cond:
                self._cond.wait_for(lambda: self._sent - self._confirmed + len(piece) <= self.WINDOW, timeout=60)
                self._sent += len(piece)
            channel, properties = self._pub, self._properties
            self.connection.ioloop.add_callback_threadsafe(
                lambda piece=piece: [channel.basic_publish(SUBJECT, "", p, properties) for p in piece])

    def publish(self, payload: bytes) -> None:
        self._publish_batch([payload])

    def send_all(self, make_payload: Callable[[], bytes], count: int, rate: float) -> None:
        def send(n: int) -> None:
            self._publish_batch([make_payload() for _ in range(n)])

        if rate <= 0:
            for start in range(0, count, self.WINDOW):
                send(min(self.WINDOW, count - start))
        else:
            pace(count, rate, send)

    def drain(self) -> int:
        """Wait for every confirm; the number confirmed (nacks are not)."""
        with self._cond:
            self._cond.wait_for(lambda: self._confirmed >= self._sent, timeout=60)
            return self._confirmed - self._nacked

    def close(self) -> None:
        if hasattr(self, "_ioloop"):
            self.connection.ioloop.add_callback_threadsafe(self.connection.close)
            self.connection.ioloop.add_callback_threadsafe(self.connection.ioloop.stop)
            self._ioloop.join(5)
            return
        super().close()
