"""Wire bytes and decoded values of one frame of every kind, as the single-module codec made them
before the protocol was declared field by field: the declarations must not change a byte.
Regenerated deliberately for data-path version 3 (frames of many topics: a delivery's `topics`
field, a two-part batch's topics array); the version-2 bytes differed in the version byte and the
delivery's element count."""

from __future__ import annotations

from typing import Any

import pytest

from roq import protocol


def representative_frames(p: Any = protocol) -> dict[str, Any]:
    """name -> (encoded frame, decoder) for every encoder; the decoder is None for frames with no decoder."""
    pid = p.publisher_id_for(bytes(range(16)))
    proof = b"P" * 32
    inc = "x1.0badf00d"
    group = p.GroupRecord("g", (b"jobs",), 30_000, 3, b"dead", 7, [(2, 0, 1, 1), (5, 1, 2, 0)])
    head, block = p.encode_batch_parts(pid, 3, 2**64 - 1, b"t", [b"a", b"bb"])
    mixed_head, mixed_block = p.encode_batch_parts(pid, 3, 0, [b"t/1", b"t/2"], [b"a", b"bb"])
    slot = p.attributed_topic(b"t", 9, 1000, b"k", {"h": b"v"})
    return {
        "request": (p.encode_request(5, "queue.create", {"name": "q"}), p.decode_request),
        "request_key": (p.encode_request(6, "queue.delete", {"name": "q"}, key="k" * 16), p.decode_request),
        "reply": (p.encode_reply(5, {"name": "q"}), p.decode_reply),
        "hello": (p.encode_hello(pid, bytes(range(16)), 1), lambda f: p.decode_publisher_frame(f, 1 << 20)),
        "batch": (p.encode_batch(pid, 7, 123456789, [b"t", b"x", slot, b"y", p.Attributed(slot, 9), b"z"]),
                  lambda f: p.decode_publisher_frame(f, 1 << 20)),
        "batch_head": (head, lambda f: p.decode_publisher_frame(f, 1 << 20, block)),
        "batch_block": (block, None),
        "batch_head_topics": (mixed_head, lambda f: p.decode_publisher_frame(f, 1 << 20, mixed_block)),
        "bye": (p.encode_bye(pid), lambda f: p.decode_publisher_frame(f, 1 << 20)),
        "welcome": (p.encode_welcome("x1", 2**63 - 1, 3), p.decode_exchange_reply),
        "ack": (p.encode_ack(9, 0), p.decode_exchange_reply),
        "reject": (p.encode_reject(9, "too_large", "message of 9 bytes"), p.decode_exchange_reply),
        "resend": (p.encode_resend(4, p.OUT_OF_ORDER, "from 4"), p.decode_exchange_reply),
        "publisher_error": (p.encode_publisher_error(p.MALFORMED, "bad"), p.decode_exchange_reply),
        "move": (p.encode_move("shutting down"), p.decode_exchange_reply),
        "delivery": (p.encode_delivery("x1", inc, 5, [[0, 4], [1, 2]], pid, 99, [1, 2], [b"a", b"b"]),
                     p.decode_delivery),
        "delivery_attrs": (p.encode_delivery("x1", inc, 5, [[0, 4]], pid, 99, [1, 2], [b"a", b"b"],
                                             [[1, 3, 0, b"k", {"h": b"v"}], [0, 0, 5, b""]]), p.decode_delivery),
        "delivery_spliced": (p.encode_delivery_spliced("x1", inc, 5, [[0, 4]], pid, 99, [3, 4], block),
                             p.decode_delivery),
        "delivery_topics": (p.encode_delivery("x1", inc, 5, [[1, 4]], pid, 99, [1, 3], [b"a", b"b"], None,
                                              [b"t/1", b"t/2"]), p.decode_delivery),
        "delivery_spliced_topics": (p.encode_delivery_spliced("x1", inc, 5, [[1, 4]], pid, 99, [3, 4], mixed_block,
                                                              [b"t/1", b"t/2"]), p.decode_delivery),
        "sync": (p.encode_sync("x1", inc, 8), p.decode_sync),
        "beat": (p.encode_sync("x1", inc, 8, p.BEAT), lambda f: p.decode_sync(f, p.BEAT)),
        "progress": (p.encode_progress("durable-1", inc, 4), p.decode_replay_request),
        "fetch": (p.encode_fetch(3, inc, 1, 0, [b"a", b""], 4096), p.decode_replay_request),
        "position_request": (p.encode_position_request(4, [b"a"]), p.decode_replay_request),
        "position_request_inc": (p.encode_position_request(4, (b"a", b"b"), inc), p.decode_replay_request),
        "frames": (p.encode_frames(3, inc, 2, [(b"t", b"body")], 9, True, 2, False),
                   lambda f: p.decode_replay_reply(f, 1 << 20)),
        "position": (p.encode_position(4, inc, 1, 9, [3, 0]), lambda f: p.decode_replay_reply(f, 1 << 20)),
        "replay_error": (p.encode_replay_error(7, "busy", "later"), None),
        "follow": (p.encode_follow(inc, "x1", proof), p.decode_replica_request),
        "copy": (p.encode_copy(inc, 3, [[b"t", b"body", 2]], proof, True), p.decode_replica_request),
        "groups": (p.encode_groups(inc, [group], proof), p.decode_replica_request),
        "done": (p.encode_done(inc, {"g": [(1, 0, 2)]}, proof), p.decode_replica_request),
        "mark": (p.encode_mark(inc, 3, proof), p.decode_replica_request),
        "adopt": (p.encode_adopt("x1.00000001", "x1", proof), p.decode_replica_request),
        "applied": (p.encode_applied(inc, "c-0123456789abcdef", [group], 4, proof), p.decode_replica_request),
        "following": (p.encode_replica_reply(p.FOLLOWING, inc, 4), p.decode_replica_reply),
        "copied": (p.encode_replica_reply(p.COPIED, inc, 5), p.decode_replica_reply),
        "sealed": (p.encode_replica_reply(p.SEALED, inc), p.decode_replica_reply),
        "marked": (p.encode_marked(inc, 3), p.decode_replica_reply),
        "recorded": (p.encode_recorded(inc, "k-abcdefgh12"), p.decode_replica_reply),
        "adoption": (p.encode_adoption("x1.00000001", inc, [group], {pid: 9}, [(2, b"t", b"body")], ("c-1",)),
                     p.decode_replica_reply),
        "join": (p.encode_join("g", [b"b", b"a", b"a"], 10, 30_000, 3, b"dead", True), p.decode_member_frame),
        "settle_ack": (p.encode_settle(p.ACK, "g", inc, [[1, 0, 2]]), p.decode_member_frame),
        "settle_nack": (p.encode_settle(p.NACK, "g", inc, [[1, 0, 2]], requeue=False), p.decode_member_frame),
        "leave": (p.encode_leave("g"), p.decode_member_frame),
        "ping": (p.encode_ping(), p.decode_member_frame),
        "joined": (p.encode_joined("g", "x1", inc), lambda f: p.decode_work_reply(f, 1 << 20)),
        "work": (p.encode_work("g", inc, [[5, 0, 2, b"jobs", pid, 99, [7, 8], [b"a", b"b"], 3, b"k"],
                                          [6, 1, 1, b"jobs", pid, 99, [9], [b"c"], 0, b"", {"h": b"v"}]]),
                 lambda f: p.decode_work_reply(f, 1 << 20)),
        "pong": (p.encode_pong(inc, ["g", "h"]), lambda f: p.decode_work_reply(f, 1 << 20)),
        "work_error": (p.encode_work_error(None, "malformed", "bad"), lambda f: p.decode_work_reply(f, 1 << 20)),
    }


# name -> (hex of the frame, repr of its decoded value or None when no decoder reads it)
EXPECTED: dict[str, tuple[str, str | None]] = {
    'request': (
        "84a17601a2696405a26f70ac71756575652e637265617465a46172677381a46e616d65a171",
        "Request(id=5, op='queue.create', args={'name': 'q'}, key=None)"),
    'request_key': (
        "85a17601a2696406a26f70ac71756575652e64656c657465a46172677381a46e616d65a171a36b6579b06b6b6b6b6b6b6b6b"
        "6b6b6b6b6b6b6b6b",
        "Request(id=6, op='queue.delete', args={'name': 'q'}, key='kkkkkkkkkkkkkkkk')"),
    'reply': (
        "84a17601a2696405a26f6bc3a6726573756c7481a46e616d65a171",
        "Reply(id=5, ok=True, result={'name': 'q'}, code='', message='', leader=None)"),
    'hello': (
        "95a568656c6c6f03ba702d396364613937363561373166333634303732643231353530c410000102030405060708090a0b0c"
        "0d0e0f01",
        "Hello(publisher='p-9cda9765a71f364072d21550', token=b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\x07\\x08\\t\\n\\x"
        "0b\\x0c\\r\\x0e\\x0f', from_seq=1)"),
    'batch': (
        "96a5626174636803ba702d39636461393736356137316633363430373264323135353007ce075bcd1596c40174c4017895c4"
        "017409cd03e8c4016b81a168c40176c4017995c4017409cd03e8c4016b81a168c40176c4017a",
        "Batch(publisher='p-9cda9765a71f364072d21550', first_seq=7, sent_ns=123456789, flat=[b't', b'x', "
        "[b't', 9, 1000, b'k', {'h': b'v'}], b'y', [b't', 9, 1000, b'k', {'h': b'v'}], b'z'], topic=None,"
        ' payloads=None, block=None)'),
    'batch_head': (
        "96a5626174636803ba702d39636461393736356137316633363430373264323135353003cfffffffffffffffffc40174",
        "Batch(publisher='p-9cda9765a71f364072d21550', first_seq=3, sent_ns=18446744073709551615, flat=[]"
        ", topic=b't', payloads=[b'a', b'bb'], block=b'\\x92\\xc4\\x01a\\xc4\\x02bb')"),
    'batch_block': (
        "92c40161c4026262",
        None),
    'batch_head_topics': (
        "96a5626174636803ba702d396364613937363561373166333634303732643231353530030092c403742f31c403742f32",
        "Batch(publisher='p-9cda9765a71f364072d21550', first_seq=3, sent_ns=0, flat=[], topic=[b't/1', b'"
        "t/2'], payloads=[b'a', b'bb'], block=b'\\x92\\xc4\\x01a\\xc4\\x02bb')"),
    'bye': (
        "93a362796503ba702d396364613937363561373166333634303732643231353530",
        "Bye(publisher='p-9cda9765a71f364072d21550')"),
    'welcome': (
        "95a777656c636f6d6503a27831cf7fffffffffffffff03",
        "ExchangeReply(kind='welcome', seq=9223372036854775807, subscribers=3, code='', message='', excha"
        "nge='x1')"),
    'ack': (
        "94a361636b030900",
        "ExchangeReply(kind='ack', seq=9, subscribers=0, code='', message='', exchange='')"),
    'reject': (
        "95a672656a6563740309a9746f6f5f6c61726765b26d657373616765206f662039206279746573",
        "ExchangeReply(kind='reject', seq=9, subscribers=None, code='too_large', message='message of 9 by"
        "tes', exchange='')"),
    'resend': (
        "95a6726573656e640304ac6f75745f6f665f6f72646572a666726f6d2034",
        "ExchangeReply(kind='resend', seq=4, subscribers=None, code='out_of_order', message='from 4', exc"
        "hange='')"),
    'publisher_error': (
        "94a56572726f7203a96d616c666f726d6564a3626164",
        "ExchangeReply(kind='error', seq=0, subscribers=None, code='malformed', message='bad', exchange='"
        "')"),
    'move': (
        "93a46d6f766503ad7368757474696e6720646f776e",
        "ExchangeReply(kind='move', seq=0, subscribers=None, code='', message='shutting down', exchange='"
        "')"),
    'delivery': (
        "9ba864656c697665727903a27831ab78312e30626164663030640592920004920102ba702d39636461393736356137316633"
        "36343037326432313535306392010292c40161c40162c0",
        "Delivery(exchange='x1', incarnation='x1.0badf00d', pos=5, chains={0: 4, 1: 2}, publisher='p-9cda"
        "9765a71f364072d21550', sent_ns=99, seqs=[1, 2], payloads=[b'a', b'b'], attrs=None, topics=None)"),
    'delivery_attrs': (
        "9ca864656c697665727903a27831ab78312e30626164663030640591920004ba702d39636461393736356137316633363430"
        "37326432313535306392010292c40161c40162c09295010300c4016b81a168c4017694000005c400",
        "Delivery(exchange='x1', incarnation='x1.0badf00d', pos=5, chains={0: 4}, publisher='p-9cda9765a7"
        "1f364072d21550', sent_ns=99, seqs=[1, 2], payloads=[b'a', b'b'], attrs=[[1, 3, 0, b'k', {'h': b'"
        "v'}], [0, 0, 5, b'']], topics=None)"),
    'delivery_spliced': (
        "9ba864656c697665727903a27831ab78312e30626164663030640591920004ba702d39636461393736356137316633363430"
        "37326432313535306392030492c40161c4026262c0",
        "Delivery(exchange='x1', incarnation='x1.0badf00d', pos=5, chains={0: 4}, publisher='p-9cda9765a7"
        "1f364072d21550', sent_ns=99, seqs=[3, 4], payloads=[b'a', b'bb'], attrs=None, topics=None)"),
    'delivery_topics': (
        "9ba864656c697665727903a27831ab78312e30626164663030640591920104ba702d39636461393736356137316633363430"
        "37326432313535306392010392c40161c4016292c403742f31c403742f32",
        "Delivery(exchange='x1', incarnation='x1.0badf00d', pos=5, chains={1: 4}, publisher='p-9cda9765a7"
        "1f364072d21550', sent_ns=99, seqs=[1, 3], payloads=[b'a', b'b'], attrs=None, topics=[b't/1', b't"
        "/2'])"),
    'delivery_spliced_topics': (
        "9ba864656c697665727903a27831ab78312e30626164663030640591920104ba702d39636461393736356137316633363430"
        "37326432313535306392030492c40161c402626292c403742f31c403742f32",
        "Delivery(exchange='x1', incarnation='x1.0badf00d', pos=5, chains={1: 4}, publisher='p-9cda9765a7"
        "1f364072d21550', sent_ns=99, seqs=[3, 4], payloads=[b'a', b'bb'], attrs=None, topics=[b't/1', b'"
        "t/2'])"),
    'sync': (
        "95a473796e6303a27831ab78312e306261646630306408",
        "Sync(exchange='x1', incarnation='x1.0badf00d', next_pos=8)"),
    'beat': (
        "95a46265617403a27831ab78312e306261646630306408",
        "Sync(exchange='x1', incarnation='x1.0badf00d', next_pos=8)"),
    'progress': (
        "95a870726f677265737303a964757261626c652d31ab78312e306261646630306404",
        "Progress(name='durable-1', incarnation='x1.0badf00d', pos=4)"),
    'fetch': (
        "98a566657463680303ab78312e3062616466303064010092c40161c400cd1000",
        "Fetch(request_id=3, incarnation='x1.0badf00d', after=1, before=0, prefixes=[b'a', b''], max_byte"
        's=4096)'),
    'position_request': (
        "94a8706f736974696f6e030491c40161",
        "PositionRequest(request_id=4, prefixes=[b'a'], incarnation='')"),
    'position_request_inc': (
        "95a8706f736974696f6e030492c40161c40162ab78312e3062616466303064",
        "PositionRequest(request_id=4, prefixes=[b'a', b'b'], incarnation='x1.0badf00d')"),
    'frames': (
        "99a66672616d65730303ab78312e3062616466303064029192c40174c404626f647909c39202c2",
        "Frames(request_id=3, incarnation='x1.0badf00d', oldest=2, frames=[(b't', b'body')], scanned_to=9"
        ', done=True, lost=2, lost_exact=False)'),
    'position': (
        "97a8706f736974696f6e0304ab78312e30626164663030640109920300",
        "StreamPosition(request_id=4, incarnation='x1.0badf00d', oldest=1, next_pos=9, last=[3, 0])"),
    'replay_error': (
        "95a56572726f720307a462757379a56c61746572",
        None),
    'follow': (
        "95a6666f6c6c6f7703ab78312e3062616466303064a27831c420505050505050505050505050505050505050505050505050"
        "5050505050505050",
        "Follow(incarnation='x1.0badf00d', exchange='x1', proof=b'PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPP')"),
    'copy': (
        "97a4636f707903ab78312e3062616466303064039193c40174c404626f647902c3c420505050505050505050505050505050"
        "5050505050505050505050505050505050",
        "Copy(incarnation='x1.0badf00d', first_pos=3, frames=[(b't', b'body', 2)], jump=True, proof=b'PPP"
        "PPPPPPPPPPPPPPPPPPPPPPPPPPPPP')"),
    'groups': (
        "95a667726f75707303ab78312e30626164663030649197a16791c4046a6f6273cd753003c404646561640792940200010194"
        "05010200c4205050505050505050505050505050505050505050505050505050505050505050",
        "GroupState(incarnation='x1.0badf00d', groups=[GroupRecord(name='g', prefixes=(b'jobs',), ack_tim"
        "eout_ms=30000, max_deliveries=3, dead_letter=b'dead', upto=7, pending=[(2, 0, 1, 1), (5, 1, 2, 0"
        ")], gap=(0, 0))], proof=b'PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPP')"),
    'done': (
        "95a4646f6e6503ab78312e30626164663030649192a1679193010002c4205050505050505050505050505050505050505050"
        "505050505050505050505050",
        "GroupsDone(incarnation='x1.0badf00d', done={'g': [(1, 0, 2)]}, proof=b'PPPPPPPPPPPPPPPPPPPPPPPPP"
        "PPPPPPP')"),
    'mark': (
        "95a46d61726b03ab78312e306261646630306403c42050505050505050505050505050505050505050505050505050505050"
        "50505050",
        "Mark(incarnation='x1.0badf00d', serial=3, proof=b'PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPP')"),
    'adopt': (
        "95a561646f707403ab78312e3030303030303031a27831c42050505050505050505050505050505050505050505050505050"
        "50505050505050",
        "Adopt(incarnation='x1.00000001', exchange='x1', proof=b'PPPPPPPPPPPPPPPPPPPPPPPPPPPPPPPP', page=None)"),
    'applied': (
        "97a76170706c69656403ab78312e3062616466303064b2632d303132333435363738396162636465669197a16791c4046a6f"
        "6273cd753003c4046465616407929402000101940501020004c4205050505050505050505050505050505050505050505050"
        "505050505050505050",
        "Applied(incarnation='x1.0badf00d', command_id='c-0123456789abcdef', groups=[GroupRecord(name='g'"
        ", prefixes=(b'jobs',), ack_timeout_ms=30000, max_deliveries=3, dead_letter=b'dead', upto=7, pend"
        "ing=[(2, 0, 1, 1), (5, 1, 2, 0)], gap=(0, 0))], purge_upto=4, proof=b'PPPPPPPPPPPPPPPPPPPPPPPPPPPP"
        "PPPP')"),
    'following': (
        "94a9666f6c6c6f77696e6703ab78312e306261646630306404",
        "ReplicaReply(kind='following', incarnation='x1.0badf00d', next_pos=4)"),
    'copied': (
        "94a6636f7069656403ab78312e306261646630306405",
        "ReplicaReply(kind='copied', incarnation='x1.0badf00d', next_pos=5)"),
    'sealed': (
        "93a67365616c656403ab78312e3062616466303064",
        "ReplicaReply(kind='sealed', incarnation='x1.0badf00d', next_pos=0)"),
    'marked': (
        "94a66d61726b656403ab78312e306261646630306403",
        "Marked(incarnation='x1.0badf00d', serial=3, kind='marked')"),
    'recorded': (
        "94a87265636f7264656403ab78312e3062616466303064ac6b2d61626364656667683132",
        "Recorded(incarnation='x1.0badf00d', command_id='k-abcdefgh12', kind='recorded')"),
    'adoption': (
        "98a861646f7074696f6e03ab78312e3030303030303031ab78312e30626164663030649197a16791c4046a6f6273cd753003"
        "c404646561640792940200010194050102009192ba702d396364613937363561373166333634303732643231353530099193"
        "02c40174c404626f647991a3632d31",
        "Adoption(incarnation='x1.00000001', ended='x1.0badf00d', groups=[GroupRecord(name='g', prefixes="
        "(b'jobs',), ack_timeout_ms=30000, max_deliveries=3, dead_letter=b'dead', upto=7, pending=[(2, 0,"
        " 1, 1), (5, 1, 2, 0)], gap=(0, 0))], high={'p-9cda9765a71f364072d21550': 9}, frames=[(2, b't', b"
        "'body')], applied=('c-1',), page=None, kind='adoption')"),
    'join': (
        "99a46a6f696e03a16793c40162c40161c401610acd753003c40464656164c3",
        "Join(group='g', prefixes=(b'a', b'b'), prefetch=10, ack_timeout_ms=30000, max_deliveries=3, dead"
        "_letter=b'dead', from_beginning=True)"),
    'settle_ack': (
        "95a361636b03a167ab78312e30626164663030649193010002",
        "Settle(kind='ack', group='g', incarnation='x1.0badf00d', ranges=[(1, 0, 2)], requeue=True)"),
    'settle_nack': (
        "96a46e61636b03a167ab78312e30626164663030649193010002c2",
        "Settle(kind='nack', group='g', incarnation='x1.0badf00d', ranges=[(1, 0, 2)], requeue=False)"),
    'leave': (
        "93a56c6561766503a167",
        "Leave(group='g')"),
    'ping': (
        "92a470696e6703",
        'Ping()'),
    'joined': (
        "95a66a6f696e656403a167a27831ab78312e3062616466303064",
        "WorkReply(kind='joined', group='g', exchange='x1', incarnation='x1.0badf00d', entries=None, grou"
        "ps=None, code='', message='')"),
    'work': (
        "95a4776f726b03a167ab78312e3062616466303064929a050002c4046a6f6273ba702d396364613937363561373166333634"
        "3037326432313535306392070892c40161c4016203c4016b9b060101c4046a6f6273ba702d39636461393736356137316633"
        "363430373264323135353063910991c4016300c40081a168c40176",
        "WorkReply(kind='work', group='g', exchange='', incarnation='x1.0badf00d', entries=[[5, 0, 2, b'j"
        "obs', 'p-9cda9765a71f364072d21550', 99, [7, 8], [b'a', b'b'], 3, b'k'], [6, 1, 1, b'jobs', 'p-9c"
        "da9765a71f364072d21550', 99, [9], [b'c'], 0, b'', {'h': b'v'}]], groups=None, code='', message='"
        "')"),
    'pong': (
        "94a4706f6e6703ab78312e306261646630306492a167a168",
        "WorkReply(kind='pong', group=None, exchange='', incarnation='x1.0badf00d', entries=None, groups="
        "['g', 'h'], code='', message='')"),
    'work_error': (
        "95a56572726f7203c0a96d616c666f726d6564a3626164",
        "WorkReply(kind='error', group=None, exchange='', incarnation='', entries=None, groups=None, code"
        "='malformed', message='bad')"),
}


def test_every_frame_is_covered() -> None:
    assert sorted(representative_frames()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_wire_bytes_are_unchanged(name: str) -> None:
    frame, decode = representative_frames()[name]
    expected_hex, expected_value = EXPECTED[name]
    assert frame.hex() == expected_hex
    if decode is not None:
        assert repr(decode(frame)) == expected_value
