"""`python -m training`'s flags are frozen: a new, removed, renamed or retyped flag, or a changed
default, choice or stack key, fails here until the committed cli_surface.txt is rewritten with
it (tests/training/driver/freeze_cli.py says how), so it is a deliberate change seen in review."""

from __future__ import annotations

import difflib

from tests.training.driver.freeze_cli import SNAPSHOT, UPDATE, surface


def test_the_flags_are_the_committed_surface():
    committed, now = SNAPSHOT.read_text(), surface()
    diff = "\n".join(difflib.unified_diff(committed.splitlines(), now.splitlines(),
                                          "committed", "now", lineterm="", n=0))
    assert now == committed, (f"the flags of `python -m training` changed; if on purpose, run "
                              f"`{UPDATE}` and commit {SNAPSHOT.name} with the change:\n{diff}")
