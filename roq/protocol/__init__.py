"""Wire formats: the control API and the data path, one module per conversation. Specified in
docs/protocol.md.

Every frame is one msgpack value. Decoders validate shape and types and raise `ProtocolError`
with a reason; they never trust a peer. Each data-path frame kind is declared once, field by
field (`fields.py`: names, types, ranges, rules across fields); its decoder's checks and error
texts come from that declaration, and tests/unit/test_protocol_docs.py holds docs/protocol.md's
frame layouts to the declarations.

The hot path keeps hand-written decoders: the exchange's `batch` (publish._decode_batch) and the
subscriber's `delivery` (deliver.decode_delivery) check exactly what BATCH_FRAME and DELIVERY_FRAME
declare, by hand, because bench/codecs.py measured the declared decoder slower on the frames
that matter (declared/hand, µs per frame: batch 1.21 at 1 message, 1.05 at 10; delivery 2.89 at
1, 2.39 at 10, 1.25 at 100; only at 1000 messages about even). msgspec (array_like Structs) decodes a
1-message frame 3.4 times faster than the hand-written code and equally at 1000, but it cannot
express the rules across fields (a chain's prev below pos, sequence numbers that would pass
2^63-1, a refused batch attributed to its publisher, header maps decoded with their own hook) nor
a uint64 bound, so it would be a second declaration beside this one plus the checks it lacks: not
adopted while a frame's per-message costs, not its header, dominate the exchange's loop.

Modules: `codec` (framing, common limits), `fields` (the declarations' vocabulary), `control`
(section 2), `publish` (3), `deliver` (4), `replay` (5), `replica` (6, 7.6), `work` (7),
`attributes` (message attributes and headers, 3.2).
"""

from __future__ import annotations

import msgpack  # noqa: F401 - callers use protocol.msgpack

from roq.errors import ProtocolError  # noqa: F401 - protocol.ProtocolError
from roq.protocol.attributes import (  # noqa: F401
    ATTRS_LEN,
    HEADERS_ATTRS_LEN,
    MAX_HEADER_KEY,
    MAX_HEADER_VALUE,
    MAX_HEADERS,
    MAX_HEADERS_BYTES,
    MAX_KEY,
    MAX_OWN_HEADERS,
    MAX_OWN_HEADERS_BYTES,
    MAX_PRIORITY,
    RESERVED_HEADER_PREFIX,
    Attributed,
    BadMap,
    attributed_topic,
    check_headers,
    headers_size,
    message_attributes,
    message_headers,
)
from roq.protocol.codec import (  # noqa: F401
    ACK,
    DATA_VERSION,
    ERROR,
    MAX_CONTROL_FRAME,
    MAX_INCARNATION,
    MAX_PREFIXES,
    MAX_SEQ,
    MAX_TOPIC,
    MAX_U64,
    VERSION,
    pack,
    unpack,
)
from roq.protocol.control import (  # noqa: F401
    Reply,
    Request,
    decode_reply,
    decode_request,
    encode_error,
    encode_reply,
    encode_request,
    request_id_of,
)
from roq.protocol.deliver import (  # noqa: F401
    BEAT,
    BEAT_TOPIC,
    DELIVERIES,
    DELIVERY,
    DELIVERY_FRAME,
    MARKERS,
    SYNC,
    SYNC_PREFIX,
    Delivery,
    Sync,
    body_topics,
    decode_delivery,
    decode_sync,
    encode_delivery,
    encode_delivery_spliced,
    encode_sync,
    sync_topic,
    topic_counts,
)
from roq.protocol.fields import (  # noqa: F401
    Conversation,
    Field,
    Frame,
)
from roq.protocol.large import LARGE_PAYLOAD_BYTES, MAX_PARTS, LargeBody, as_bytes, inline, resolve, split  # noqa: F401
from roq.protocol.publish import (  # noqa: F401
    BATCH,
    BATCH_FRAME,
    BYE,
    EXCHANGE_REPLIES,
    HELLO,
    HELLO_REQUIRED,
    MALFORMED,
    MOVE,
    OUT_OF_ORDER,
    PUBLISHER_FRAMES,
    PUBLISHER_ID,
    REJECT,
    RESEND,
    TOKEN_MAX,
    TOKEN_MIN,
    WELCOME,
    Batch,
    Bye,
    ExchangeReply,
    Hello,
    RefusedBatch,
    decode_exchange_reply,
    decode_publisher_frame,
    encode_ack,
    encode_batch,
    encode_batch_message,
    encode_batch_parts,
    encode_bye,
    encode_hello,
    encode_move,
    encode_publisher_error,
    encode_reject,
    encode_resend,
    encode_welcome,
    publisher_id_for,
    split_large,
)
from roq.protocol.replay import (  # noqa: F401
    FETCH,
    FRAMES,
    MAX_CONSUMER_NAME,
    POSITION,
    POSITION_AT,
    PROGRESS,
    REPLAY_REPLIES,
    REPLAY_REQUESTS,
    Fetch,
    Frames,
    PositionAtRequest,
    PositionRequest,
    Progress,
    ReplayRefused,
    StreamPosition,
    TimePosition,
    decode_replay_reply,
    decode_replay_request,
    encode_fetch,
    encode_frames,
    encode_frames_message,
    encode_position,
    encode_position_at,
    encode_position_at_request,
    encode_position_request,
    encode_progress,
    encode_replay_error,
)
from roq.protocol.replica import (  # noqa: F401
    ADOPT,
    ADOPTION,
    APPLIED,
    BROKEN,
    COPIED,
    COPY,
    DONE,
    FILL,
    FILL_ENDED,
    FILLED,
    FILLED_ENDED,
    FOLLOW,
    FOLLOWING,
    GROUPS,
    MARK,
    MARKED,
    MAX_APPLIED,
    MAX_COPY_FRAME,
    MAX_PROOF,
    MAX_STORED_AT_US,
    MIN_PROOF,
    RECORDED,
    REPLICA_REPLIES,
    REPLICA_REQUESTS,
    SEALED,
    Adopt,
    Adoption,
    Applied,
    Broken,
    Copy,
    Fill,
    Filled,
    Follow,
    GroupRecord,
    GroupsDone,
    GroupState,
    Mark,
    Marked,
    Recorded,
    ReplicaReply,
    copy_digest,
    decode_replica_reply,
    decode_replica_request,
    encode_adopt,
    encode_adoption,
    encode_applied,
    encode_broken,
    encode_copy,
    encode_done,
    encode_fill,
    encode_filled,
    encode_follow,
    encode_groups,
    encode_mark,
    encode_marked,
    encode_recorded,
    encode_replica_reply,
    is_command_id,
)
from roq.protocol.work import (  # noqa: F401
    JOIN,
    JOINED,
    LEAVE,
    MAX_DELIVERIES,
    MAX_GROUP_NAME,
    MAX_PREFETCH,
    MAX_WORK_RANGES,
    MEMBER_FRAMES,
    NACK,
    PING,
    PONG,
    WORK,
    WORK_REPLIES,
    Join,
    Leave,
    Ping,
    Settle,
    WorkReply,
    decode_member_frame,
    decode_work_reply,
    encode_join,
    encode_joined,
    encode_leave,
    encode_ping,
    encode_pong,
    encode_settle,
    encode_work,
    encode_work_error,
)

# Every data-path conversation's declared frames, by the side that sends them (the docs test reads these).
CONVERSATIONS = {
    "publish": (PUBLISHER_FRAMES, EXCHANGE_REPLIES),
    "deliver": (DELIVERIES, *MARKERS.values()),
    "replay": (REPLAY_REQUESTS, REPLAY_REPLIES),
    "replica": (REPLICA_REQUESTS, REPLICA_REPLIES),
    "work": (MEMBER_FRAMES, WORK_REPLIES),
}

__all__ = [name for name in dir() if not name.startswith("_") and name != "annotations"]
