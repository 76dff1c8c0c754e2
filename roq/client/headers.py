"""The headers of a received message that has none, shared by subscribers and group members."""

from __future__ import annotations

from collections.abc import Iterator, Mapping


class _NoHeaders(Mapping[str, bytes]):
    """An empty mapping that cannot be changed (every such message shares it), equal to {} and
    picklable (as itself)."""

    __slots__ = ()

    def __getitem__(self, key: str) -> bytes:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "{}"

    def __reduce__(self) -> str:
        return "EMPTY_HEADERS"  # the module's one instance


EMPTY_HEADERS: Mapping[str, bytes] = _NoHeaders()
