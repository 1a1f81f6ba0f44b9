"""The job's settings as a stack writes them: camelCase keys (`maxFailures`), numbers that
`pulumi config set --path` stored as text, every problem at once naming `<prefix><key>` and its
flag. Standard library only: the Pulumi program renders and checks a stack's `training` object
with it before any resource."""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from typing import Any, Literal, Mapping

from training.config import TrainConfig, exclusive, flag_name
from training.errors import ConfigError


def setting_key(name: str) -> str:
    """The settings key of a field: its flag in camelCase (`max_failures` -> `maxFailures`)."""
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def closest(key: str, known: list[str], prefix: str = "") -> str:
    """`; did you mean <prefix>X?` for the nearest known key, or nothing."""
    match = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"; did you mean {prefix}{match[0]}?" if match else ""


def from_settings(settings: Mapping[str, Any], prefix: str = "",
                  owned_elsewhere: Mapping[str, str] | None = None,
                  fixed: Mapping[str, Any] | None = None) -> TrainConfig:
    """A validated TrainConfig from camelCase settings (a stack's `training` object), every
    problem at once, each naming `<prefix><key>` and its flag. `owned_elsewhere` maps the fields
    the caller sets itself to where they come from; setting one here is a problem. `fixed` holds
    the values the caller will set (e.g. the worker count), so checks that depend on them run now."""
    owned = {setting_key(k): v for k, v in (owned_elsewhere or {}).items()}
    fields = {setting_key(f.name): f for f in dataclasses.fields(TrainConfig)
              if setting_key(f.name) not in owned}
    hints = typing.get_type_hints(TrainConfig)
    problems, values = [], {}
    for key, value in settings.items():
        f = fields.get(key)
        if key in owned:
            problems.append(f"{prefix}{key}: not a setting here; {owned[key]}")
            continue
        if f is None:
            problems.append(f"{prefix}{key}: unknown key{closest(key, list(fields), prefix)} "
                            f"(known: {', '.join(fields)})")
            continue
        allowed = _allowed(hints[f.name])
        value = _number_from_text(value, allowed)
        if not any(_is(value, t) for t in allowed):
            names = " or ".join(_type_name(t) for t in allowed)
            problems.append(f"{prefix}{key}: expected {names}, got {value!r}")
            continue
        values[f.name] = float(value) if float in allowed and isinstance(value, int) else value
    if problems:
        raise ConfigError(problems)
    cfg = TrainConfig(**values, **(fixed or {}))
    flag_to_key = {f"--{flag_name(f.name)}": setting_key(f.name) for f in dataclasses.fields(TrainConfig)}
    found = [re.sub(r"^(--[a-z0-9-]+)", lambda m: f"{prefix}{flag_to_key.get(m[1], m[1])} ({m[1]})", p)
             for p in cfg.problems() + exclusive(values)]
    if found:
        raise ConfigError(found)
    return cfg


def _allowed(hint) -> tuple:
    """The accepted value types of a field's hint; a Literal's values stand for themselves."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is Literal:
        return args
    return args if args else (hint,)


def _number_from_text(value: Any, allowed: tuple) -> Any:
    """`pulumi config set --path training.lr 0.0002` stores text (only integers and booleans are
    typed), so a number written as text is read as the number a numeric field wants."""
    if isinstance(value, str):
        for kind in (int, float):
            if kind in allowed:
                try:
                    return kind(value)
                except ValueError:
                    pass
    return value


def _is(value: Any, t) -> bool:
    if t is type(None):
        return value is None
    if not isinstance(t, type):  # a Literal value
        return value == t
    if t in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, t) or (t is float and isinstance(value, int))


def _type_name(t) -> str:
    if t is type(None):
        return "null"
    return t.__name__ if isinstance(t, type) else repr(t)
