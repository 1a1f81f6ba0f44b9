"""Committed stack files as the raw values Pulumi hands the program: Pulumi.yaml's defaults
merged under each stack's own values, as the CLI does (stack.parse.declared)."""

from __future__ import annotations

from pathlib import Path

import yaml

from stack.parse import as_config_string, declared
from tests.conftest import REPO

PROJECT = yaml.safe_load((REPO / "Pulumi.yaml").read_text())["name"]
STACK_FILES = sorted(REPO.glob("Pulumi.*.yaml"))


def stack_name(path: Path) -> str:
    return path.name.removeprefix("Pulumi.").removesuffix(".yaml")


def raw_config(path: Path) -> tuple[dict[str, str], str]:
    """(every project key -> its value as a string, as `pulumi.Config.get` returns it under
    `pulumi up`; aws:region)."""
    config = yaml.safe_load(path.read_text())["config"]
    raw = dict(declared())
    for key, value in config.items():
        ns, _, name = key.partition(":")
        if ns == PROJECT:
            raw[name] = as_config_string(value)
    return raw, config["aws:region"]
