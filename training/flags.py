"""The job's command line, both ways: TrainConfig's options -> argparse flags (for `python -m
training` and `python -m bench`) and a TrainConfig -> the flags that reproduce it (for the RayJob
entrypoint). Each flag's type and choices are its field's annotation (training.field_types).
Standard library only, so the Pulumi program renders entrypoints without torch or ray.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools

from training.config import TrainConfig, flag_name
from training.options import Option, options
from training.run_names import default_name
from training.field_types import choices, value_type


def flag(name: str) -> str:
    return "--" + flag_name(name)


class _IntoGroup(argparse.Action):
    """Stores a grouped option (a test hook) into its group's dataclass under the group's
    name, so the parsed namespace holds TrainConfig's own fields (`test_hooks=TestHooks(...)`),
    and an untouched group stays None like every flag not given."""

    def __init__(self, *args, option: Option, **kwargs):
        super().__init__(*args, **kwargs)
        self.option = option

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        current = getattr(namespace, self.dest) or self.option.owner()
        setattr(namespace, self.dest, dataclasses.replace(current, **{self.option.name: values}))


def add_config_flags(ap: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """One flag per TrainConfig option (or the `names` given), typed and documented from the
    field, defaulting to None so that only what the user gave overrides a default. A group's
    options (the test hooks) are accepted but left out of --help and the usage: they are no
    setting a user makes (argparse.SUPPRESS); the frozen CLI surface still lists them."""
    groups = {}
    for option in options():
        if names is not None and option.name not in names:
            continue
        kwargs = {"default": None, "help": f"{option.field.metadata['help']} (default: "
                                           f"{option.field.default})"}
        if value_type(option.hint) is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif choices(option.hint):
            kwargs["choices"] = choices(option.hint)
        else:
            kwargs["type"] = value_type(option.hint)
        if option.group is None:
            ap.add_argument(flag(option.name), **kwargs)
            continue
        if option.group not in groups:  # titled by its name; no description: nothing to show
            groups[option.group] = ap.add_argument_group(option.group.replace("_", " "))
        groups[option.group].add_argument(
            flag(option.name), dest=option.group, metavar=option.name.upper(),
            action=functools.partial(_IntoGroup, option=option),
            **{**kwargs, "help": argparse.SUPPRESS})


def render(cfg: TrainConfig) -> list[str]:
    """The flags that turn the defaults into `cfg`: every option that differs from its default,
    in option order (`--x`/`--no-x` for booleans); the name only when it is not the one the
    run's settings give it (run_names.py). Parsing them gives `cfg` back."""
    args: list[str] = []
    for option in options():
        value = option.value(cfg)
        default = default_name(cfg) if option.name == "name" else option.field.default
        if value == default or value is None:
            continue
        if isinstance(value, bool):
            args.append(flag(option.name) if value else "--no-" + flag_name(option.name))
        else:
            args += [flag(option.name), repr(value) if isinstance(value, float) else str(value)]
    return args
