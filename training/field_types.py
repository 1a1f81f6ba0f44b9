"""What a field's annotation allows, read from the annotation itself: the types and `Literal`
values of its hint, and a number's range (`Bounds`, carried in `Annotated`). TrainConfig's
validation, its flags and a stack's settings all check against these, so no choice or range is
written twice. Standard library only (the Pulumi program checks a stack's settings with it)."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True, kw_only=True)
class Bounds:
    """A number field's range, written in its annotation (`Annotated[int, Bounds(ge=1)]`, as
    annotated-types' Ge/Gt/Lt) and checked with its type; `means` names the lowest value's
    meaning for the message (`-1 (any number) or more`). None always passes (an unset option)."""
    ge: float | None = None
    gt: float | None = None
    lt: float | None = None
    means: str | None = None

    def holds(self, value: float | None) -> bool:
        return value is None or ((self.ge is None or value >= self.ge)
                                 and (self.gt is None or value > self.gt)
                                 and (self.lt is None or value < self.lt))

    def __str__(self) -> str:
        if self.gt is not None:
            return "positive" if self.gt == 0 else f"above {self.gt}"
        if self.lt is not None:
            return f"at least {self.ge} and below {self.lt}"
        if self.means is not None:
            return f"{self.ge} ({self.means}) or more"
        return f"at least {self.ge}" if self.ge >= 1 else f"{self.ge} or more"


def accepted(hint: Any) -> tuple:
    """What an option's hint accepts: its types (None as `type(None)`), and a Literal's values
    themselves, `Literal["a", "b"] | None` -> ("a", "b", NoneType)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return tuple(v for member in (typing.get_args(hint) if union else (hint,))
                 for v in (typing.get_args(member) if typing.get_origin(member) is Literal
                           else (member,)))


def fits(hint: Any, value: Any) -> bool:
    """Whether the value is one the hint accepts (an int is a float; a bool is no number)."""
    return any(_fits(value, t) for t in accepted(hint))


def is_typed(hint: Any, value: Any) -> bool:
    """Whether the value has the hint's type at least (`"fp16"` is a str, as a Literal's values
    are, though no choice), so that checks comparing it with other values can run."""
    return any(_fits(value, t if isinstance(t, type) else type(t)) for t in accepted(hint))


def expected(hint: Any) -> str:
    """What the hint accepts, in words: `float`, `bool or null`, `'fp32' or 'bf16' or null`."""
    return " or ".join(_type_name(t) for t in accepted(hint))


def _fits(value: Any, t: Any) -> bool:
    if t is type(None):
        return value is None
    if not isinstance(t, type):  # a Literal value
        return value == t and type(value) is type(t)
    if t in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, t) or (t is float and isinstance(value, int))


def _type_name(t: Any) -> str:
    if t is type(None):
        return "null"
    return t.__name__ if isinstance(t, type) else repr(t)


def choices(hint: Any) -> tuple:
    """A Literal hint's values (without None: an option left unset), () for a plain type."""
    return tuple(v for v in accepted(hint) if not isinstance(v, type))


def value_type(hint: Any) -> type:
    """The type an option's value has when set: `int | None` -> int, a Literal's values' type."""
    return next(t if isinstance(t, type) else type(t) for t in accepted(hint)
                if t is not type(None))
