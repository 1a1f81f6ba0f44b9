"""The job's settings as a stack writes them: camelCase keys (`maxFailures`), numbers that
`pulumi config set --path` stored as text, every problem at once naming `<prefix><key>` and its
flag. Standard library only: the Pulumi program renders and checks a stack's `training` object
with it before any resource."""

from __future__ import annotations

import difflib
import re
from typing import Any, Mapping

from training.config import TrainConfig, exclusive
from training.options import build, options
from training.errors import ConfigError
from training.field_types import accepted, expected, fits


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
    """A validated TrainConfig from camelCase settings (a stack's `training` object: one key per
    flag, the test hooks' too), every problem at once, each naming `<prefix><key>` and its flag.
    `owned_elsewhere` maps the fields the caller sets itself to where they come from; setting
    one here is a problem. `fixed` holds the values the caller will set (e.g. the worker
    count), so checks that depend on them run now."""
    owned = {setting_key(k): v for k, v in (owned_elsewhere or {}).items()}
    keys = {setting_key(o.name): o for o in options() if setting_key(o.name) not in owned}
    problems, values = [], {}
    for key, value in settings.items():
        option = keys.get(key)
        if key in owned:
            problems.append(f"{prefix}{key}: not a setting here; {owned[key]}")
            continue
        if option is None:
            listed = ", ".join(k for k, o in keys.items() if o.group is None)
            problems.append(f"{prefix}{key}: unknown key{closest(key, list(keys), prefix)} "
                            f"(known: {listed})")
            continue
        value = _number_from_text(value, accepted(option.hint))
        if not fits(option.hint, value):
            problems.append(f"{prefix}{key}: expected {expected(option.hint)}, got {value!r}")
            continue
        widen = float in accepted(option.hint) and isinstance(value, int)
        values[option.name] = float(value) if widen else value
    if problems:
        raise ConfigError(problems)
    cfg = build({**values, **(fixed or {})})
    flag_to_key = {o.flag: setting_key(o.name) for o in options()}

    def named(flag: re.Match) -> str:  # `--grad-accum` -> `training.gradAccum (--grad-accum)`
        return f"{prefix}{flag_to_key.get(flag[1], flag[1])} ({flag[1]})"

    found = [re.sub(r"^(--[a-z0-9-]+)", named, p) for p in cfg.problems() + exclusive(values)]
    if found:
        raise ConfigError(found)
    return cfg


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
