"""Committed stack files as the raw values Pulumi hands the program."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.conftest import REPO

PROJECT = yaml.safe_load((REPO / "Pulumi.yaml").read_text())["name"]
STACK_FILES = sorted(REPO.glob("Pulumi.*.yaml"))


def stack_name(path: Path) -> str:
    return path.name.removeprefix("Pulumi.").removesuffix(".yaml")


def raw_config(path: Path) -> tuple[dict[str, str], str]:
    """(project keys -> values as strings, as `pulumi.Config.get` returns them; aws:region)."""
    config = yaml.safe_load(path.read_text())["config"]
    raw = {}
    for key, value in config.items():
        ns, _, name = key.partition(":")
        if ns != PROJECT:
            continue
        raw[name] = (json.dumps(value) if isinstance(value, (dict, list))
                     else str(value).lower() if isinstance(value, bool) else str(value))
    return raw, config["aws:region"]
