"""The program's error root, standard library only, so every layer can subclass it: the Pulumi
program (`__main__.py`) and the job's driver (`training.driver.cli`) each catch `InputError` once,
print its message and exit non-zero, never a traceback."""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user, at any layer (a stack key, a job flag, a zone, a data row, a model
    path, the storage path): one clear message and a non-zero exit."""


class ConfigError(InputError):
    """Bad settings; the message lists every problem with the key or flag that fixes it."""

    def __init__(self, problems: list[str], what: str = "training settings"):
        self.problems = problems
        super().__init__(f"invalid {what}:\n" + "\n".join(f"  - {p}" for p in problems))


def first_line(e: BaseException) -> str:
    """A library exception's first non-blank line (its type's name when it says nothing): what a
    one-line error message quotes of it."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
