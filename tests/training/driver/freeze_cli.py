"""The surface of `python -m training`: one line per flag with its group, kind, type, choices,
default and stack key, from the parser itself. test_cli_surface.py compares it with the committed
cli_surface.txt, so that adding, removing, renaming or retyping a flag (or changing a default) is a
deliberate change, seen in review as a diff of that file. Help texts are left out: rewording one
is no change of the surface. After changing a flag on purpose, rewrite the file and commit it
with the change:

    python -m tests.training.driver.freeze_cli --write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from training.options import options
from training.driver.cli import build_parser
from training.settings import setting_key

SNAPSHOT = Path(__file__).with_name("cli_surface.txt")
UPDATE = "python -m tests.training.driver.freeze_cli --write"


def surface() -> str:
    """The flags of `python -m training`, in --help order, one line each."""
    by_flag = {o.flag: o for o in options()}
    lines = [f"# `python -m training` flags; regenerate with `{UPDATE}`"]
    ap = build_parser()
    for group in ap._action_groups:
        for action in group._group_actions:
            if isinstance(action, argparse._HelpAction):
                continue
            option = by_flag.get(action.option_strings[0])
            lines.append(" ".join([
                "/".join(action.option_strings), f"group={group.title.replace(' ', '-')}",
                f"kind={_kind(action)}",
                f"choices={','.join(map(str, action.choices))}" if action.choices else "",
                f"default={option.field.default if option else action.default!r}",
                f"key={setting_key(option.name)}" if option else "key=-"]).replace("  ", " "))
    return "\n".join(lines) + "\n"


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "bool"
    if isinstance(action, argparse._StoreTrueAction):
        return "switch"
    return getattr(action.type, "__name__", "str")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {UPDATE}")
    SNAPSHOT.write_text(surface())
    print(f"wrote {SNAPSHOT}")
