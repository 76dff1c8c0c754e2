"""The systems RoQ is compared with, behind roq.tools.bench's adapter interface.

Each is used the way its Python client is normally used for pub/sub, with the
batching its client offers, and with limits raised so that nothing is dropped
for a slow subscriber (so throughput is not bought with loss):
* raw ZeroMQ: PUB → SUB, one message per send, no broker, no high-water mark;
  and batched by hand (one msgpack list of payloads per send), for reference;
* python-hop: raw ZeroMQ through one minimal Python forwarding process
  (`bench/hop.py`): the latency floor of any broker written in Python;
* NATS: nats-py (asyncio), core publish/subscribe, pending limits lifted;
* Redis: redis-py PUBLISH (pipelined by 100 when unpaced), SUBSCRIBE;
* RabbitMQ: pika, a fanout exchange, one exclusive auto-ack queue per
  subscriber, no publisher confirms.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from roq.tools.bench import Adapter, BatchAdapter

SUBJECT = "bench"


class ZmqAdapter(Adapter):
    """settings: {"endpoint": "tcp://127.0.0.1:port"}; the publisher binds, subscribers connect."""

    name = "zeromq"

    def subscribe(self, on_payload: Callable[[bytes], None]) -> None:
        import zmq
        self.context = zmq.Context()
        sock = self.context.socket(zmq.SUB)
        sock.linger = 0
        sock.rcvhwm = 0
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(self.settings["endpoint"])
        self._stop = threading.Event()

        def loop() -> None:
            recv = sock.recv
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

    def close(self) -> None:
        if hasattr(self, "_thread"):
            self._stop.set()
            self._thread.join(5)
        if hasattr(self, "sock"):
            self.sock.close()
        if hasattr(self, "context"):
            self.context.term()


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
    """settings: {"url": "nats://127.0.0.1:port"}."""

    name = "nats"

    def subscribe(self, on_payload: Callable[[bytes], None]) -> None:
        import nats
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        async def start() -> None:
            self.nc = await nats.connect(self.settings["url"], pending_size=1 << 30)

            async def handler(msg: Any) -> None:
                on_payload(msg.data)

            await self.nc.subscribe(SUBJECT, cb=handler, pending_msgs_limit=10_000_000,
                                    pending_bytes_limit=1 << 30)
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

    def open_publisher(self) -> None:
        import nats
        self._loop = asyncio.new_event_loop()
        self.nc = self._loop.run_until_complete(nats.connect(self.settings["url"], pending_size=1 << 30))

    def publish(self, payload: bytes) -> None:
        self._loop.run_until_complete(self.nc.publish(SUBJECT, payload))

    def send_all(self, make_payload: Callable[[], bytes], count: int, rate: float) -> None:
        async def send() -> None:
            publish = self.nc.publish
            if rate <= 0:
                for _ in range(count):
                    await publish(SUBJECT, make_payload())
                return
            start, sent = time.monotonic(), 0
            while sent < count:
                due = min(count, int((time.monotonic() - start) * rate) + 1)
                if due <= sent:
                    await self.nc.flush()
                    await asyncio.sleep(min(0.0002, (sent + 1 - due) / rate))
                    continue
                for _ in range(due - sent):
                    await publish(SUBJECT, make_payload())
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
                queue = channel.queue_declare("", exclusive=True).method.queue
                channel.queue_bind(queue, SUBJECT)
                channel.basic_consume(queue, lambda ch, method, props, body: on_payload(body), auto_ack=True)
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
