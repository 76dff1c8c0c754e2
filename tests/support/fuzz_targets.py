"""Fuzz targets: every decoder of untrusted bytes, each as a function of one input.

A target returns normally for any input, refusing bad ones with the error its decoder
documents (a `UserError`: ProtocolError, ConfigError, InvalidNameError, ...). Anything else
escaping is a bug: the fuzzer (scripts/fuzz.py, atheris) reports it as a crash, and
tests/unit/test_fuzz_corpus.py replays the kept corpus through the same functions.

The exchange targets drive a real Forwarder (real ZeroMQ sockets on loopback), so a hostile
publisher's or subscriber's frame goes through exactly what it would reach in production; the
work session target plays several group members against a real work socket (exchange/work.py)
and checks the groups' invariants after every step (a violation is an AssertionError: a crash);
the replica targets likewise drive a real Replica (exchange/replica.py): a primary's follow and
copy frames, and subscribers' fetches and position requests naming stored incarnations.
"""

from __future__ import annotations

import functools
import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from roq import protocol
from roq.config import Config, config_from_json
from roq.config.loading import _apply
from roq.errors import UserError
from roq.permissions import Entry, PermissionTable, from_message, to_message

if TYPE_CHECKING:
    from exchange.groups import Groups
    from exchange.replica import Replica

Target = Callable[[bytes], None]
MAX_REPLY = 1 << 20


def _refused(decode: Callable[[bytes], object]) -> Target:
    def target(data: bytes) -> None:
        try:
            decode(data)
        except UserError:
            pass  # refused with a clear error: what must happen to garbage
    target.__doc__ = f"{getattr(decode, '__name__', 'decoder')} on arbitrary bytes"
    return target


def control_request(data: bytes) -> None:
    """What a GCM does with a request before touching ZooKeeper: decode, authorise, validate arguments."""
    from gcm.api import needs_admin
    from gcm.autoscaler import check_rules
    from gcm.daemon import _args
    from gcm.queues import check_exchange_count
    from roq.names import check_queue_name
    request = protocol.decode_request(data)
    needs_admin(request.op, request.args)
    args = _args(request.args, [], ["name", "exchanges", "rules", "clear"])
    check_queue_name(args.get("name", "q"))
    check_exchange_count(args.get("exchanges", 1))
    check_rules({}, args.get("rules") or {})


def permission_table(data: bytes) -> None:
    """The permission table as its znode (and a backup's section) holds it, then as an HCM's line to
    its exchanges. What is taken must round-trip and answer questions; the rest is refused."""
    try:
        table = PermissionTable.from_znode(data)
    except UserError:
        table = None
    if table is not None:
        for name in list(table.entries)[:3] + ["stranger"]:
            table.allows(name, "publish", "orders.eu")
            table.uses(name, "x")
        try:
            again = PermissionTable.from_znode(table.to_znode())
        except UserError:  # over MAX_TABLE_BYTES once compacted: refused, as a grant making it would be
            again = table
        assert again == table, "a table changed on its way through its znode"
    try:
        line = json.loads(data)
    except (ValueError, RecursionError):
        return  # what the exchange does with a line that is not JSON: nothing
    if isinstance(line, dict) and "permissions" in line:
        try:
            from_message(line["permissions"], "none")
        except UserError:
            pass


def config_toml(data: bytes) -> None:
    """A configuration file: TOML syntax, then the schema (unknown keys, types, ranges)."""
    try:
        layer = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return  # load_config reports these as ConfigError naming the file
    try:
        _apply(Config(), layer, "fuzz")
    except UserError:
        pass


def config_json(data: bytes) -> None:
    """The configuration an HCM hands its exchanges."""
    config_from_json(data.decode("utf-8", errors="replace"))


@functools.lru_cache(maxsize=1)
def _forwarder():
    import zmq

    from exchange.forwarder import Forwarder
    from exchange.parts import Site
    from roq.config import ExchangeConfig
    config = ExchangeConfig(max_message_bytes=1024, max_batch_bytes=65536, retention_bytes=1 << 20)
    return Forwarder.open(zmq.Context.instance(), config, Site("x1", "127.0.0.1", "127.0.0.1"))


def envelope(data: bytes) -> None:
    """An HTTP caller's JSON envelope (`envelope=json`): each message's payload and headers decoded
    and checked, or refused with a UserError; what is taken must be within the headers' limits."""
    from roq.client.envelope import decode_envelope
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return  # the gateway answers 400 "not JSON"
    for item in value if isinstance(value, list) else [value]:
        try:
            payload, headers = decode_envelope(item)
        except UserError:
            continue
        assert isinstance(payload, bytes) and protocol.headers_size(headers) <= protocol.MAX_HEADERS_BYTES


def exchange_publisher_frame(data: bytes) -> None:
    """A publisher's frame at a live exchange: decoded, validated, forwarded or refused."""
    _forwarder().handle_publisher(b"fuzz", data)


BLOCK_ROUTE, BLOCK_TOKEN = b"fuzz-block", b"b" * 16


def exchange_block_batch(data: bytes) -> None:
    """The payload block of a two-part batch (protocol 3.2) at a live exchange, from a publisher
    that said hello: refused whole, or forwarded with each payload checked."""
    forwarder = _forwarder()
    pid = protocol.publisher_id_for(BLOCK_TOKEN)
    session = forwarder.sessions.sessions.get(pid)
    if session is None or session.route != BLOCK_ROUTE:
        forwarder.handle_publisher(BLOCK_ROUTE, protocol.encode_hello(pid, BLOCK_TOKEN, 1))
        session = forwarder.sessions.sessions[pid]
    head, _ = protocol.encode_batch_parts(pid, session.last + 1, 0, b"t", [])
    forwarder.handle_publisher(BLOCK_ROUTE, head, data)


def exchange_topics_batch(data: bytes) -> None:
    """The `topics` field of a two-part batch (protocol 3.2: one bin, or one per payload) at a live
    exchange, as any msgpack value, before a valid block of three payloads: refused whole, rejected
    message by message, or cut into frames (exchange/grouping.py)."""
    forwarder = _forwarder()
    pid = protocol.publisher_id_for(BLOCK_TOKEN)
    session = forwarder.sessions.sessions.get(pid)
    if session is None or session.route != BLOCK_ROUTE:
        forwarder.handle_publisher(BLOCK_ROUTE, protocol.encode_hello(pid, BLOCK_TOKEN, 1))
        session = forwarder.sessions.sessions[pid]
    try:
        topics = protocol.msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:
        return
    head = protocol.msgpack.packb([protocol.BATCH, protocol.DATA_VERSION, pid, session.last + 1, 0, topics],
                                  use_bin_type=True)
    forwarder.handle_publisher(BLOCK_ROUTE, head, protocol.msgpack.packb([b"a", b"", b"c" * 40]))


FUZZ_PARTS = (b"L" * 600, b"M" * 3)  # the parts after a fuzzed block or body (protocol 3.2.2, 4.2)


def exchange_parted_batch(data: bytes) -> None:
    """The block of a two-part batch followed by two large payloads' parts (protocol 3.2.2) at a
    live exchange: refused whole, or forwarded with the parts after the delivery, which decodes
    to the payloads the block and the parts make."""
    import zmq
    forwarder = _forwarder()
    pid = protocol.publisher_id_for(BLOCK_TOKEN)
    session = forwarder.sessions.sessions.get(pid)
    if session is None or session.route != BLOCK_ROUTE:
        forwarder.handle_publisher(BLOCK_ROUTE, protocol.encode_hello(pid, BLOCK_TOKEN, 1))
        session = forwarder.sessions.sessions[pid]
    head, _ = protocol.encode_batch_parts(pid, session.last + 1, 0, b"t", [])
    next_pos = forwarder.retention.next_pos
    forwarder.handle_publisher(BLOCK_ROUTE, head, data, [zmq.Frame(p) for p in FUZZ_PARTS])
    if forwarder.retention.next_pos > next_pos:
        (_, body), = forwarder.retention.read(next_pos - 1, next_pos + 1, [], 1 << 30)[0]
        assert isinstance(body, protocol.LargeBody) and len(body.parts) <= len(FUZZ_PARTS)
        protocol.decode_delivery(body)


def exchange_fetch(data: bytes) -> None:
    """A subscriber's fetch or position request at a live exchange."""
    _forwarder().replay.handle(b"fuzz", data)


def exchange_work_frame(data: bytes) -> None:
    """A group member's frame on a live exchange's work socket, then a dispatch turn."""
    forwarder = _forwarder()
    try:
        forwarder.work.handle(b"fuzz", data)
    except UserError:
        return  # answered `error malformed` by WorkServer.drain
    forwarder.groups.tick()
    forwarder.work.pump()


WORK_ROUTES = (b"m0", b"m1", b"m2")
WORK_CAP = 8  # exchange.group_max_prefetch of the session target: small, so members reach it


@functools.lru_cache(maxsize=1)
def _work_server():
    """A real WorkServer on a real ROUTER, with one connected DEALER per member route (so that work
    frames are really sent); each input gets fresh groups."""
    import zmq

    from exchange.groups import Groups
    from exchange.retention import Retention
    from exchange.work import WorkServer, work_socket
    context = zmq.Context.instance()
    sock = work_socket(context)
    sock.bind("inproc://fuzz-work")
    server = WorkServer(sock, Groups(max_prefetch=WORK_CAP), "x1", "x1.ab", Retention(60, 1 << 20),
                        lambda kind, n: None, lambda *a, **kw: server.groups.offer(*a, **kw))
    dealers = []
    for route in WORK_ROUTES:
        dealer = context.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.routing_id = route
        dealer.connect("inproc://fuzz-work")
        dealers.append(dealer)
    return server, dealers


class _Ops:
    """The input read as a program: one byte chooses the step, the next ones its arguments."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def byte(self) -> int:
        self.at += 1
        return self.data[self.at - 1] if self.at <= len(self.data) else 0

    def more(self) -> bool:
        return self.at < len(self.data)


def exchange_work_session(data: bytes) -> None:
    """Members on a live work socket: joins with any prefetch (up to 2^24), acks and nacks of any
    ranges, nack-with-requeue loops, leaves, raw frames, messages arriving between them. After every
    step no member holds more than the cap, and every message offered is ready, delayed, in flight,
    acked or dead-lettered: exactly once in the counts. A violation raises AssertionError (a crash)."""
    from exchange.groups import Groups
    server, dealers = _work_server()
    server.groups = Groups(max_prefetch=WORK_CAP)
    ops, pos = _Ops(data), 0
    while ops.more():
        step, route = ops.byte() % 8, WORK_ROUTES[ops.byte() % len(WORK_ROUTES)]
        if step == 0:
            prefetch = max(1, min(protocol.MAX_PREFETCH, ops.byte() << 16 | ops.byte() << 8 | ops.byte()))
            frame = protocol.encode_join("w", [b"jobs"], prefetch, 30_000, 3, b"dead", False)
        elif step in (1, 2, 3):
            ranges = [[ops.byte() % 8 + 1, ops.byte() % 32, ops.byte() % 32 + 1]]
            kind = protocol.ACK if step == 1 else protocol.NACK
            frame = protocol.encode_settle(kind, "w", "x1.ab", ranges, requeue=step == 2)
        elif step == 4:  # the nack loop: everything it holds, back with requeue
            group = server.groups.groups.get("w")
            member = group.members.get(route) if group is not None else None
            held = [[u.pos, u.idx, u.count] for u in member.units] if member is not None else []
            frame = protocol.encode_settle(protocol.NACK, "w", "x1.ab", held, requeue=True)
        elif step == 5:
            frame = protocol.encode_leave("w")
        elif step == 6:
            pos += 1
            count = ops.byte() % 32 + 1
            server.groups.offer(pos, b"jobs", "p", 0, list(range(1, count + 1)), [b"x"] * count)
            frame = protocol.encode_ping()
        else:
            frame = bytes(ops.byte() for _ in range(ops.byte() % 64))
        try:
            server.handle(route, frame)
        except UserError:
            pass  # answered `error malformed` by WorkServer.drain
        server.pump()
        for dealer in dealers:
            while dealer.poll(0):
                dealer.recv()
        _check_groups(server.groups)


def _check_groups(groups: Groups) -> None:
    for group in groups.groups.values():
        for member in group.members.values():
            assert member.in_flight <= WORK_CAP, f"a member holds {member.in_flight} > {WORK_CAP}"
            assert member.in_flight == sum(u.count for u in member.units)
        c = group.counters
        assert c.offered == c.acked + c.dead_lettered + group.ready + group.delayed_count + group.in_flight_count


FUZZ_PROOF = b"p" * 32  # the copy secret of the fuzzed replica's incarnations


@functools.lru_cache(maxsize=1)
def _replica():
    import zmq

    from exchange.replica import Replica
    from roq.config import ExchangeConfig
    config = Config(exchange=ExchangeConfig(retention_bytes=1 << 20, fetch_max_bytes=65536))
    replica = Replica(zmq.Context.instance(), config, "x1", "127.0.0.1", "127.0.0.1")
    # x1.cd ended, x1.ab runs (as the replica's HCM would say): each with a copy of a few frames.
    _follow_and_copy(replica, {"x1.cd": 1, "x1.ab": 1})
    return replica


def _follow_and_copy(replica: Replica, firsts: dict[str, int]) -> None:
    """Each incarnation vouched for, followed, and a copy of three frames from its first position
    (a jump past 1) taken, in order: the last one is the running one."""
    digest = protocol.copy_digest(FUZZ_PROOF)
    for incarnation, first in firsts.items():
        replica.learn_primary({"incarnation": incarnation, "copy_digest": digest})
        replica._take_news()
        replica._follow(b"fuzz", protocol.Follow(incarnation, "x1", FUZZ_PROOF))
        replica._copy(b"fuzz", protocol.Copy(incarnation, first, [(b"t", b"body", 1)] * 3, first > 1, FUZZ_PROOF))


def replica_frame(data: bytes) -> None:
    """A frame on a replica's `repl` socket, handled as Replica._drain_primary handles it: only
    frames whose proof holds reach the copies."""
    _handle_frame(_replica(), data)


def _handle_frame(replica: Replica, data: bytes) -> None:
    try:
        request = protocol.decode_replica_request(data)
    except UserError:
        return
    if replica.proof_holds(b"fuzz", request):
        replica.handle(b"fuzz", request)


@functools.lru_cache(maxsize=1)
def _disk_replica():
    """A replica whose copies go to disk (under a fresh directory): x1.ab followed, its copy jumped
    to position 40 (so a state transfer toward 40 is taken), x1.cd's copy from position 1."""
    import atexit
    import shutil
    import tempfile

    import zmq

    from exchange.replica import Replica
    from roq.config import ExchangeConfig
    from roq.storage_policy import StoragePolicy
    root = Path(tempfile.mkdtemp(prefix="roq-fuzz-replica-"))
    atexit.register(shutil.rmtree, root, True)
    config = Config(exchange=ExchangeConfig(retention_bytes=1 << 20, fetch_max_bytes=65536))
    replica = Replica(zmq.Context.instance(), config, "x1", "127.0.0.1", "127.0.0.1", store_root=root / "x1~r")
    replica.disk.start(StoragePolicy(retention=3_600.0))
    _follow_and_copy(replica, {"x1.cd": 1, "x1.ab": 40})
    return root, replica


def replica_disk_frame(data: bytes) -> None:
    """A frame on the `repl` socket of a replica that keeps its copies on disk (fill frames of a
    state transfer included): nothing is written outside its root, a transfer never reaches the
    copy it fills, and what the copy serves is never below its start unless a transfer completed."""
    root, replica = _disk_replica()
    _handle_frame(replica, data)
    for path in root.rglob("*"):
        assert path.resolve().is_relative_to(root.resolve()), f"{path} is outside the replica's root"
    for incarnation, base in replica.disk.bases.items():
        assert base.end_pos <= replica.disk.starts[incarnation], "a transfer reached into its copy"
    for incarnation, store in replica.disk.stores.items():
        started = replica.disk.starts.get(incarnation, 1)
        assert store.first_pos >= started or incarnation in replica.disk.in_sync, "a partial transfer served"


def replica_fetch(data: bytes) -> None:
    """A subscriber's fetch or position request (naming a stored incarnation) at a replica."""
    _replica().replay.handle(b"fuzz", data)


@functools.cache
def _metadata_server():
    """A real ControlServer routing to a real MetadataService over a fixed topology (the cache's
    part: what ZooKeeper would hold), with small limits so a session can reach them."""
    from gcm.api import PEER, ControlServer, unknown_op
    from gcm.metadata import MetadataService
    config = Config().replace(gcm={"metadata_max_queues": 4, "metadata_max_watchers": 3, "metadata_rate": 50})
    pushed: list[tuple[bytes, bytes]] = []

    def body(queue: str) -> dict[str, object]:
        live = {"x1": {"pub": "tcp://h:1", "sub": "tcp://h:2", "incarnation": "x1.ab", "stats": {}}}
        return {"queue": queue, "exists": queue == "q", "exchanges": live if queue == "q" else {}, "replicas": {},
                "relocations": {}, "leader": None, "gcms": []}
    service = MetadataService("gcm-fuzz", config.gcm, body, lambda: True, lambda p, f: pushed.append((p, f)))
    server = ControlServer(config, "127.0.0.1", 0, "127.0.0.1", lambda op: {
        "metadata.get": lambda a: service.get(a, PEER.get()),
        "metadata.watch": lambda a: service.watch(a, PEER.get())}.get(op) or unknown_op(op))
    return server, service, pushed


def metadata_session(data: bytes) -> None:
    """Hostile clients' metadata requests: the first byte of each record picks the connection, the
    rest is one request frame (records split at b"\\n\\n"), dispatched as the control loop does; then
    a change is pushed. Every reply must be a reply; limits must hold."""
    from gcm.api import PEER
    from roq.protocol.metadata import decode_push
    server, service, pushed = _metadata_server()
    for record in data.split(b"\n\n")[:64]:
        if not record:
            continue
        token = PEER.set(bytes([record[0] % 5]))
        try:
            reply = protocol.decode_reply(server.dispatch(record[1:], None))
        finally:
            PEER.reset(token)
        assert reply.ok or reply.code, reply
    service.dirty("q")
    service._flush()
    assert service.watchers <= service.config.metadata_max_watchers
    for _, frame in pushed:
        assert decode_push(frame) is not None
    pushed.clear()


TARGETS: dict[str, Target] = {
    "publisher_frame": _refused(lambda d: protocol.decode_publisher_frame(d, 65536)),
    "delivery": _refused(protocol.decode_delivery),
    "sync": _refused(protocol.decode_sync),
    "beat": _refused(lambda d: protocol.decode_sync(d, protocol.BEAT)),
    "fetch": _refused(protocol.decode_replay_request),
    "fetch_reply": _refused(lambda d: protocol.decode_replay_reply(d, MAX_REPLY)),
    "fetch_reply_parts": _refused(lambda d: protocol.decode_replay_reply(d, MAX_REPLY, FUZZ_PARTS)),
    "delivery_parts": _refused(lambda d: protocol.decode_delivery(d, FUZZ_PARTS)),
    "position": _refused(lambda d: protocol.decode_replay_reply(d, MAX_REPLY)),
    "exchange_reply": _refused(protocol.decode_exchange_reply),
    "control_reply": _refused(protocol.decode_reply),
    "control_request": _refused(control_request),
    "config_toml": config_toml,
    "permissions": permission_table,
    "config_json": _refused(config_json),
    "exchange_publisher_frame": exchange_publisher_frame,
    "envelope": envelope,
    "exchange_fetch": exchange_fetch,
    "exchange_block_batch": exchange_block_batch,
    "exchange_topics_batch": exchange_topics_batch,
    "exchange_parted_batch": exchange_parted_batch,
    "member_frame": _refused(protocol.decode_member_frame),
    "work_reply": _refused(lambda d: protocol.decode_work_reply(d, MAX_REPLY)),
    "exchange_work_frame": exchange_work_frame,
    "exchange_work_session": exchange_work_session,
    "replica_request": _refused(protocol.decode_replica_request),
    "replica_reply": _refused(protocol.decode_replica_reply),
    "replica_frame": replica_frame,
    "replica_fetch": replica_fetch,
    "replica_disk_frame": replica_disk_frame,
    "metadata_session": metadata_session,
}


def seeds() -> dict[str, list[bytes]]:
    """Valid inputs to start each corpus from, so the fuzzer begins deep inside each decoder."""
    token = b"t" * 16
    pid = protocol.publisher_id_for(token)
    delivery = protocol.encode_delivery("x1", "x1.ab", 3, [[0, 1], [1, 2]], pid, 5, [1, 2], [b"a", b"b"])
    mixed_delivery = protocol.encode_delivery("x1", "x1.ab", 3, [[1, 2]], pid, 5, [1, 3], [b"a", b"b"], None,
                                              [b"t/1", b"t/2"])
    batch = protocol.encode_batch(pid, 1, 5, [b"t", b"one", b"t", b"two", b"u", b"three"])
    hello = protocol.encode_hello(pid, token, 1)
    fetch = protocol.encode_fetch(1, "x1.ab", 0, 10, [b"t"], 4096)
    ended = protocol.encode_position_request(4, [b"t", b""], "x1.ab")  # a stored incarnation's end
    follow = protocol.encode_follow("x1.ab", "x1", FUZZ_PROOF)
    copy = protocol.encode_copy("x1.ab", 4, [[b"t", delivery, 2], [b"u", b"x", 1]], FUZZ_PROOF)
    jump = protocol.encode_copy("x1.ab", 9, [[b"t", delivery, 2]], FUZZ_PROOF, jump=True)
    forged = protocol.encode_copy("x1.ab", 5, [[b"t", delivery, 2]], b"f" * 32, jump=True)  # a wrong proof
    join = protocol.encode_join("workers", [b"t", b"u"], 10, 30_000, 5, b"dead", True)
    ack = protocol.encode_settle(protocol.ACK, "workers", "x1.ab", [[1, 0, 2], [3, 1, 1]])
    nack = protocol.encode_settle(protocol.NACK, "workers", "x1.ab", [[1, 0, 2]], requeue=False)
    work = protocol.encode_work("workers", "x1.ab", [[3, 0, 1, b"t", pid, 5, [1, 2], [b"a", b"b"], 0, b""]])
    attributed = protocol.encode_batch(pid, 1, 5, [[b"t", 3, 0, b"k"], b"one", b"t", b"two"])
    headed = protocol.encode_batch(pid, 1, 5, [[b"t", 0, 0, b"", {"trace-id": b"4bf9", "n": b""}], b"one",
                                               [b"t", 2, 0, b"k", {"roq-forged": b"x"}], b"two",
                                               [b"t", 0, 0, b"", {"k" * 129: b"v"}], b"three"])
    headed_delivery = protocol.encode_delivery("x1", "x1.ab", 4, [], pid, 5, [1, 2], [b"a", b"b"],
                                               [[1, 0, 0, b"", {"trace-id": b"4bf9", "roq-reason": b"nack"}]])
    headed_work = protocol.encode_work("workers", "x1.ab", [[3, 0, 1, b"t", pid, 5, [1], [b"a"], 0, b"", {"h": b"v"}]])
    record = protocol.GroupRecord("workers", (b"t",), 30_000, 5, b"dead", 5, [(3, 0, 2, 1)])
    groups = protocol.encode_groups("x1.ab", [record], FUZZ_PROOF)
    done = protocol.encode_done("x1.ab", {"workers": [(3, 0, 1)]}, FUZZ_PROOF)
    adopt = protocol.encode_adopt("x1.cd", "x1", FUZZ_PROOF)
    mark = protocol.encode_mark("x1.ab", 3, FUZZ_PROOF)
    parted = protocol.encode_delivery("x1", "x1.ab", 5, [], pid, 5, [1, 2, 3], [0, b"s", 1])
    parted_page = protocol.encode_frames_message(2, "x1.ab", 1, [(b"t", delivery),
                                                                 (b"t", protocol.LargeBody(parted, FUZZ_PARTS))],
                                                 5, True, 0, True)[0]
    return {
        "fetch_reply_parts": [parted_page],
        "delivery_parts": [parted, protocol.encode_delivery("x1", "x1.ab", 5, [], pid, 5, [1, 2], [1, 0])],
        "exchange_parted_batch": [protocol.pack([0, b"small", 1]), protocol.pack([0, 1]), protocol.pack([1, 0]),
                                  protocol.pack([0, b"x" * 2000, 1])],
        "publisher_frame": [batch, hello, protocol.encode_bye(pid), attributed, headed],
        "delivery": [delivery, headed_delivery, mixed_delivery],
        "sync": [protocol.encode_sync("x1", "x1.ab", 7)],
        "beat": [protocol.encode_sync("x1", "x1.ab", 7, protocol.BEAT)],
        "fetch": [fetch, protocol.encode_position_request(3, [b"t", b""]), ended],
        "fetch_reply": [protocol.encode_frames(1, "x1.ab", 1, [(b"t", delivery)], 3, True, 2, True)],
        "position": [protocol.encode_position(1, "x1.ab", 1, 9, [3, 8])],
        "exchange_reply": [protocol.encode_ack(4, 1), protocol.encode_welcome("x1", 3, 2),
                           protocol.encode_resend(5, protocol.OUT_OF_ORDER, "m")],
        "control_reply": [protocol.pack({"v": protocol.VERSION, "id": 1, "ok": True, "result": [1]}),
                          protocol.pack({"v": protocol.VERSION, "id": 1, "ok": False,
                                         "error": {"code": "not_leader", "message": "m", "leader": "tcp://x:1"}})],
        "control_request": [protocol.encode_request(1, "queue.create", {"name": "orders", "exchanges": 2}),
                            protocol.encode_request(2, "queue.rules", {"name": "q", "rules": {"max_rate": 10.0}})],
        "config_toml": [b'[zk]\nhosts = "a:1,b:2"\nsession_timeout = 3\n[security]\ncurve = false\n',
                        b'[exchange]\nmax_message_bytes = 1024\nmax_batch_bytes = 4096\n'],
        "config_json": [Config().to_json().encode()],
        "permissions": [PermissionTable({"pub": Entry(publish=("orders.*",)), "ops": Entry(admin=True)}).to_znode(),
                        json.dumps(to_message(PermissionTable({"s": Entry(subscribe=("*", "log-??"))}, version=7)),
                                   separators=(",", ":")).encode()],
        "exchange_publisher_frame": [hello, batch, attributed, headed],
        "envelope": [json.dumps({"payload": "x", "headers": {"trace-id": "4bf9"}}).encode(),
                     json.dumps([{"payload": "/w==", "encoding": "base64", "headers": {"k": "/w=="},
                                  "headers_encoding": "base64"}, {"payload": ""}]).encode()],
        "exchange_fetch": [fetch, protocol.encode_position_request(3, [b"t"]), ended],
        "exchange_block_batch": [protocol.encode_batch_parts(pid, 1, 5, b"t", [b"one", b"", b"x" * 300])[1],
                                 protocol.pack([b"ok", "a str"]), protocol.pack([b"x" * 2000])],
        "exchange_topics_batch": [protocol.pack(b"t"), protocol.pack([b"t/1", b"t/2", b"u"]),
                                  protocol.pack([b"t", b"", b"\x00x"]), protocol.pack([b"t", b"u"]),
                                  protocol.pack([b"t", 5, b"u"])],
        "member_frame": [join, ack, nack, protocol.encode_leave("workers"), protocol.encode_ping()],
        "work_reply": [work, headed_work, protocol.encode_joined("workers", "x1", "x1.ab"),
                       protocol.encode_pong("x1.ab", ["w"]),
                       protocol.encode_work_error("workers", "group_mismatch", "m")],
        "exchange_work_frame": [join, ack, nack, protocol.encode_ping(),
                                protocol.encode_join("workers", [b"t"], 100_000, 30_000, 5, b"dead", False)],
        # join m0 with prefetch 100,000 and m1 with 1; 32 messages; m0 nacks all it holds three
        # times; m1 acks one; m0 leaves; a raw frame
        "exchange_work_session": [bytes([0, 0, 1, 134, 160, 0, 1, 0, 0, 1, 6, 0, 31, 4, 0, 4, 0, 4, 0,
                                         1, 1, 1, 0, 0, 5, 0, 7, 2, 3, 1, 2, 3])],
        "replica_request": [follow, copy, jump, groups, done, mark, adopt,
                            protocol.encode_fill("x1.ab", 1, 40, [[0, b"t", delivery, 2]], FUZZ_PROOF, jump=True)],
        "replica_reply": [protocol.encode_adoption("x1.cd", "x1.ab", [record], {pid: 4}, [(3, b"t", delivery)]),
                          protocol.encode_replica_reply(protocol.FOLLOWING, "x1.ab", 7),
                          protocol.encode_replica_reply(protocol.COPIED, "x1.ab", 9),
                          protocol.encode_replica_reply(protocol.SEALED, "x1.ab"), protocol.encode_marked("x1.ab", 3),
                          protocol.encode_filled("x1.ab", 12, 40)],
        "replica_frame": [follow, copy, jump, forged, protocol.encode_follow("x1.cd", "x1", FUZZ_PROOF), groups,
                          done, mark, adopt],
        "metadata_session": [b"\x00" + protocol.encode_request(1, "metadata.watch", {"queues": ["q", "r"]})
                             + b"\n\n\x01" + protocol.encode_request(2, "metadata.get", {"queue": "q"})
                             + b"\n\n\x02" + protocol.encode_request(3, "metadata.watch", {"queues": ["q"] * 9})],
        "replica_disk_frame": [
            protocol.encode_fill("x1.ab", 1, 40, [[1_700_000_000_000_000, b"t", delivery, 2]] * 3, FUZZ_PROOF,
                                 jump=True),
            protocol.encode_fill("x1.ab", 4, 40, [[1_700_000_000_000_000, b"u", b"x", 1]] * 36, FUZZ_PROOF),
            protocol.encode_fill("x1.ab", 30, 40, [[0, b"t", delivery, 2]], FUZZ_PROOF, jump=True),
            protocol.encode_fill("x1.cd", 1, 2, [[0, b"t", delivery, 2]], FUZZ_PROOF),
            protocol.encode_fill("x1.ab", 1, 41, [], b"f" * 32), copy, jump, follow],
        "replica_fetch": [fetch, ended, protocol.encode_position_request(5, [b"t"], "x1.zz"),
                          protocol.encode_position_request(6, [b"t"], "x1.cd")],
    }
