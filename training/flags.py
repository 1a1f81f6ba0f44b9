"""The job's command line, both ways: TrainConfig fields -> argparse flags (for `python -m
training` and `python -m bench`) and a TrainConfig -> the flags that reproduce it (for the RayJob
entrypoint). Standard library only, so the Pulumi program renders entrypoints without torch or ray.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing

from training.config import TrainConfig, flag_name


def flag(name: str) -> str:
    return "--" + flag_name(name)


def add_config_flags(ap: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """One flag per TrainConfig field (or the `names` given), typed and documented from the
    field, defaulting to None so that only what the user gave overrides a default."""
    hints = typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if names is not None and f.name not in names:
            continue
        help_text = (argparse.SUPPRESS if f.metadata.get("hidden")
                     else f"{f.metadata['help']} (default: {f.default})")
        hint = hints[f.name]
        if hint in (bool, bool | None):
            ap.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, default=None,
                            help=help_text)
        elif typing.get_origin(hint) is typing.Literal:
            ap.add_argument(flag(f.name), choices=typing.get_args(hint), default=None,
                            help=help_text)
        else:
            base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
            ap.add_argument(flag(f.name), type=base, default=None, help=help_text)


def render(cfg: TrainConfig) -> list[str]:
    """The flags that turn the defaults into `cfg`: every field that differs from its default,
    in field order (`--x`/`--no-x` for booleans). Parsing them gives `cfg` back."""
    args: list[str] = []
    for f in dataclasses.fields(TrainConfig):
        value = getattr(cfg, f.name)
        if value == f.default or value is None:
            continue
        if isinstance(value, bool):
            args.append(flag(f.name) if value else "--no-" + flag_name(f.name))
        else:
            args += [flag(f.name), repr(value) if isinstance(value, float) else str(value)]
    return args
