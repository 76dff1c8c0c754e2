"""How a setting is declared: its default, its range and a one-line description, next to its field.

`setting()` puts them in the field's metadata; `check_field` derives each setting's own range check
from them, `declared` lists them for the documentation (docs/config.md, roq/config/docs.py). Rules
that tie two settings together are in roq/config/rules.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from roq.errors import ConfigError

# A per-setting rule beyond a range: given the value, what is wrong with it ("must be ...") or None.
Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class Declared:
    """One setting as declared: what the documentation shows and what `check_field` enforces."""
    section: str
    key: str
    type: str
    default: Any
    help: str
    positive: bool = False
    lo: float | None = None
    hi: float | None = None
    choices: Sequence[Any] = ()
    note: str = ""  # what a special value means ("0 = off"), in the range column and the error
    rule: str = ""  # the `check`'s rule in words, for the documentation
    check: Check | None = None

    @property
    def name(self) -> str:
        return f"{self.section}.{self.key}"

    def range_text(self) -> str:
        """The accepted values in words, for the documentation."""
        if self.choices:
            text = " or ".join(", ".join(map(str, self.choices)).rsplit(", ", 1))
        elif self.positive and self.hi is not None:
            text = f"> 0, <= {_number(self.hi)}"
        elif self.positive:
            text = "> 0"
        elif self.lo is not None and self.hi is not None:
            text = f"{_number(self.lo)} to {_number(self.hi)}"
        elif self.lo is not None:
            text = f">= {_number(self.lo)}"
        else:
            text = self.rule
        return f"{text} ({self.note})" if text and self.note else text or self.note

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` ("must be ..."), or None when it is within the declaration."""
        note = f" ({self.note})" if self.note else ""
        if self.choices and value not in self.choices:
            return f"must be {' or '.join(', '.join(map(str, self.choices)).rsplit(', ', 1))}, got {value!r}"
        if self.positive and value <= 0:
            return f"must be positive, got {value}"
        if self.lo is not None and self.hi is not None and not self.positive and not self.lo <= value <= self.hi:
            return f"must be from {_number(self.lo)} to {_number(self.hi)}{note}, got {value}"
        if self.lo is not None and self.hi is None and value < self.lo:
            bound = ">= 0" if self.lo == 0 else f"at least {_number(self.lo)}"
            return f"must be {bound}{note}, got {value}"
        if self.positive and self.hi is not None and value > self.hi:
            return f"must be at most {_number(self.hi)}{note}, got {value}"
        return self.check(value) if self.check else None


def setting(default: Any, help: str, *, positive: bool = False, lo: float | None = None, hi: float | None = None,
            choices: Sequence[Any] = (), note: str = "", check: Check | None = None, rule: str = "") -> Any:
    """A section's field: its default, its range (`positive`: > 0; `lo`, `hi`: inclusive bounds;
    `choices`; `check` for any other rule of this setting alone, `rule` saying it in words) and a
    one-line description."""
    spec = {"help": help, "positive": positive, "lo": lo, "hi": hi, "choices": tuple(choices), "note": note,
            "check": check, "rule": rule}
    return field(default=default, metadata={"setting": spec})


def declared(section: str, cls: type) -> Iterator[Declared]:
    """The declarations of a section's dataclass, in field order."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("setting")
        if spec is None:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with setting()")
        yield Declared(section, f.name, str(f.type), f.default, **spec)


def check_section(section: str, values: Any) -> None:
    """Each setting of a section against its own declaration: the first one out of range is a
    ConfigError naming it."""
    for setting_ in declared(section, type(values)):
        problem = setting_.problem(getattr(values, setting_.key))
        if problem:
            raise ConfigError(f"{setting_.name} {problem}")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
