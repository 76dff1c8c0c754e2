"""The hot path's decoders, hand-written against declared: a batch of 1, 10, 100 and 1000 messages
(100 B payloads) as the exchange reads it, and the delivery a subscriber reads for it, decoded by
each in one invocation. Prints µs per frame and the ratio; roq/protocol/__init__.py says which
one is used and why."""

from __future__ import annotations

import timeit

from roq import protocol
from roq.protocol.deliver import decode_delivery_declared
from roq.protocol.publish import decode_batch_declared, unpack_publisher_frame

PAYLOAD = b"x" * 100
PID = protocol.publisher_id_for(b"k" * 16)


def _per_call(fn, arg) -> float:  # type: ignore[no-untyped-def]
    runs, seconds = timeit.Timer(lambda: fn(arg)).autorange()
    best = min([seconds] + timeit.Timer(lambda: fn(arg)).repeat(4, runs))
    return best / runs * 1e6


def main() -> None:
    print(f"{'frame':<16} {'messages':>8} {'hand µs':>9} {'declared µs':>12} {'declared/hand':>14}")
    for count in (1, 10, 100, 1000):
        batch = protocol.encode_batch(PID, 1, 0, [b"t", PAYLOAD] * count)
        hand = _per_call(lambda f: protocol.decode_publisher_frame(f, 1 << 24), batch)
        declared = _per_call(lambda f: decode_batch_declared(unpack_publisher_frame(f, 1 << 24), PID), batch)
        print(f"{'publish batch':<16} {count:>8} {hand:>9.2f} {declared:>12.2f} {declared / hand:>14.2f}")
        delivery = protocol.encode_delivery("x1", "x1.0badf00d", 5, [[0, 4], [1, 3]], PID, 0,
                                            list(range(1, count + 1)), [PAYLOAD] * count)
        hand = _per_call(protocol.decode_delivery, delivery)
        declared = _per_call(decode_delivery_declared, delivery)
        print(f"{'delivery':<16} {count:>8} {hand:>9.2f} {declared:>12.2f} {declared / hand:>14.2f}")


if __name__ == "__main__":
    main()
