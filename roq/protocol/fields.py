"""Frames declared as data: each kind's fields with their types and ranges, and one routine that
checks a decoded body against its declaration and says, in the refusal, which field is wrong and
what it must be. docs/protocol.md's frame layouts are tested against these declarations."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from roq.errors import ProtocolError
from roq.protocol.codec import DATA_VERSION, MAX_SEQ, MAX_U64, all_ints, kind_and_version


def _bound(value: int) -> str:
    return {MAX_SEQ: "2^63-1", MAX_U64: "2^64-1"}.get(value, str(value))


class Type:
    """A field's type and range: `ok` says whether a decoded value fits, `doc` says what fits."""

    doc = "any value"

    def ok(self, value: Any) -> bool:
        return True


Anything = Type()


class Int(Type):
    """An integer in min..max (msgpack never sends a bool or a float where this is asked)."""

    def __init__(self, min: int = 0, max: int = MAX_SEQ) -> None:  # noqa: A002 - the spec's words
        self.min, self.max = min, max
        self.doc = f"int {_bound(min)}..{_bound(max)}"

    def ok(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and self.min <= value <= self.max


class Bool(Type):
    doc = "bool"

    def ok(self, value: Any) -> bool:
        return isinstance(value, bool)


class _Sized(Type):
    kind: Any = object  # str or bytes
    name = ""

    def __init__(self, min_len: int = 0, max_len: int | None = None, doc: str = "") -> None:
        self.min_len, self.max_len = min_len, max_len
        unit = "characters" if self.kind is str else "bytes"
        if max_len is not None:
            size = f" of {min_len}-{max_len} {unit}"
        else:
            size = f" of at least {min_len} {unit}" if min_len else ""
        self.doc = doc or f"{self.name}{size}"

    def ok(self, value: Any) -> bool:
        return isinstance(value, self.kind) and self.min_len <= len(value) \
            and (self.max_len is None or len(value) <= self.max_len)


class Str(_Sized):
    kind, name = str, "str"


class Bin(_Sized):
    kind, name = bytes, "bin"


class Pattern(Type):
    """A str matching a regular expression, as a whole."""

    def __init__(self, pattern: re.Pattern[str], doc: str) -> None:
        self.pattern, self.doc = pattern, doc

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and self.pattern.fullmatch(value) is not None


class Test(Type):
    """A value a named predicate accepts (a name's grammar, a headers map)."""

    def __init__(self, test: Callable[[Any], bool], doc: str) -> None:
        self.test, self.doc = test, doc

    def ok(self, value: Any) -> bool:
        return bool(self.test(value))


class Nullable(Type):
    def __init__(self, inner: Type) -> None:
        self.inner, self.doc = inner, f"{inner.doc} or nil"

    def ok(self, value: Any) -> bool:
        return value is None or self.inner.ok(value)


class ListOf(Type):
    """An array of min_len..max_len items of one type. Arrays of unbounded ints or of bin (a
    frame's sequence numbers and payloads: one per message) are checked in C-level passes."""

    def __init__(self, item: Type, min_len: int = 0, max_len: int | None = None) -> None:
        self.item, self.min_len, self.max_len = item, min_len, max_len
        count = f"{min_len}-{max_len} " if max_len is not None else (f"at least {min_len} " if min_len else "")
        self.doc = f"[{item.doc}, ...] ({count}items)" if count else f"[{item.doc}, ...]"
        if isinstance(item, Int):
            self._all: Callable[[list[Any]], bool] = lambda values: all_ints(values, item.min, item.max)
        elif type(item) is Bin and item.min_len == 0 and item.max_len is None:
            self._all = lambda values: not values or set(map(type, values)) == {bytes}
        else:
            self._all = lambda values: all(map(item.ok, values))

    def ok(self, value: Any) -> bool:
        return isinstance(value, list) and self.min_len <= len(value) \
            and (self.max_len is None or len(value) <= self.max_len) and self._all(value)


@dataclass(frozen=True)
class Field:
    """One element of an array: its name (as docs/protocol.md calls it), its type, and how the
    docs' frame layouts write it when that is not the name (`[seq, ...]` for `seqs`)."""
    name: str
    type: Type = Anything
    shown: str = ""
    optional: bool = False  # only trailing fields: the array may end before it
    default: Any = None  # the value an absent optional field decodes to

    @property
    def layout(self) -> str:
        return self.shown or self.name


Rule = tuple[Callable[..., bool], str]  # a check across fields (called with every field's value), and its text


class Array(Type):
    """A fixed array of named fields (the last ones may be optional), with rules across them."""

    def __init__(self, *fields: Field, rules: Sequence[Rule] = ()) -> None:
        self.fields, self.rules = fields, tuple(rules)
        self.most = len(fields)
        self.least = sum(1 for f in fields if not f.optional)
        self.doc = "[" + ", ".join(f"{f.name} ({f.type.doc})" for f in fields) + "]"

    def ok(self, value: Any) -> bool:
        return isinstance(value, list) and self.least <= len(value) <= self.most \
            and all(f.type.ok(v) for f, v in zip(self.fields, value)) \
            and all(rule(*self._complete(value)) for rule, _ in self.rules)

    def _complete(self, values: list[Any]) -> list[Any]:
        return values + [f.default for f in self.fields[len(values):]]


@dataclass(frozen=True)
class Frame:
    """A frame kind: [kind, DATA_VERSION, *fields], the rules across its fields, and what it decodes to."""
    kind: str
    fields: tuple[Field, ...]
    build: Callable[..., Any]
    rules: tuple[Rule, ...] = ()
    body: Array = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "body", Array(*self.fields, rules=self.rules))

    @property
    def layout(self) -> str:
        """The frame as docs/protocol.md writes it: ["kind", 2, field, ...]."""
        return "[" + ", ".join([f'"{self.kind}"', str(DATA_VERSION)] + [f.layout for f in self.fields]) + "]"

    def values(self, msg: list[Any]) -> list[Any]:
        """The fields of a body whose kind and version were read, each checked; ProtocolError
        naming the first field that does not fit (or the rule a valid set of fields breaks)."""
        body = self.body
        values = msg[2:]
        if not body.least <= len(values) <= body.most:
            raise ProtocolError(f"{self.kind} must be {self.layout}: {len(msg)} elements")
        for f, value in zip(self.fields, values):
            if not f.type.ok(value):
                raise ProtocolError(f"{self.kind} must be {self.layout}: {f.name} must be {f.type.doc}")
        values = body._complete(values)
        for rule, text in self.rules:
            if not rule(*values):
                raise ProtocolError(f"{self.kind} must be {self.layout}: {text}")
        return values

    def decode(self, msg: list[Any]) -> Any:
        return self.build(*self.values(msg))


def frame(kind: str, *fields: Field, build: Callable[..., Any], rules: Sequence[Rule] = ()) -> Frame:
    return Frame(kind, fields, build, tuple(rules))


class Conversation:
    """The frames one side of a conversation may send: each decoded by its declaration."""

    def __init__(self, what: str, *frames: Frame) -> None:
        self.what = what
        self.frames = {f.kind: f for f in frames}

    def frame_of(self, msg: Any) -> Frame:
        kind = kind_and_version(msg, self.what)
        declared = self.frames.get(kind)
        if declared is None:
            raise ProtocolError(f"unknown {self.what} kind {kind!r}")
        return declared

    def decode(self, msg: Any) -> Any:
        return self.frame_of(msg).decode(msg)
