"""The job's options as the CLI and a stack see them: one per TrainConfig field (and per field of
the dataclasses it groups, the test hooks), read from the fields' annotations, so the flags, a
stack's keys and the validation share one list; and a TrainConfig built back from them."""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from training.config import TrainConfig, flag_name
from training.field_types import Bounds


@dataclass(frozen=True)
class Option:
    """One option of the job as the CLI and a stack see it, one flag (`--fault-at-step`) and
    one stack key (`faultAtStep`): a TrainConfig field, or a field of one it groups (`group`:
    `test_hooks`, of type `owner`), with its annotation."""
    field: dataclasses.Field
    hint: Any  # the annotation without Annotated's extras: a type, a Literal, or a union of them
    bounds: Bounds | None
    owner: type
    group: str | None = None

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def flag(self) -> str:
        return "--" + flag_name(self.name)

    def value(self, cfg: TrainConfig) -> Any:
        return getattr(getattr(cfg, self.group) if self.group else cfg, self.name)


@functools.cache
def options() -> tuple[Option, ...]:
    """Every option, in field order: TrainConfig's settings, then the fields of the dataclasses
    it groups (the test hooks). Option names are unique: each is one flag."""
    hints = _hints(TrainConfig)
    owners = [(None, TrainConfig)] + [(f.name, hints[f.name])
                                      for f in dataclasses.fields(TrainConfig)
                                      if dataclasses.is_dataclass(hints[f.name])]
    out = []
    for group, owner in owners:
        owner_hints = _hints(owner)
        for f in dataclasses.fields(owner):
            hint, bounds = owner_hints[f.name], None
            if dataclasses.is_dataclass(hint):
                continue
            if typing.get_origin(hint) is Annotated:
                bounds = next((m for m in hint.__metadata__ if isinstance(m, Bounds)), None)
                hint = hint.__origin__
            out.append(Option(f, hint, bounds, owner, group))
    return tuple(out)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def build(values: Mapping[str, Any]) -> TrainConfig:
    """A TrainConfig from option values by name (`fault_at_step` too): a group's options are
    gathered into its dataclass."""
    by_name = {o.name: o for o in options()}
    top, groups = {}, {}
    for name, value in values.items():
        option = by_name[name]
        if option.group is None:
            top[name] = value
        else:
            groups.setdefault((option.group, option.owner), {})[name] = value
    return TrainConfig(**top, **{group: owner(**kw) for (group, owner), kw in groups.items()})
