"""The start every benchmark's `main()` shares: Ray's chatter filtered, the command line read,
and a refused flag reported the same way.

Written once because the benchmarks record the argv they ran with as their result's `command`
(an empty list, not `sys.argv`, when a test calls `main([])`), and a bad flag must be one
`error: ...` line and exit status 2 before any device or Ray is touched, whichever benchmark it is.
Standard library only at import, so `python -m bench.X --help` loads no torch.
"""

from __future__ import annotations

import argparse
import sys


def start(parser: argparse.ArgumentParser,
          argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The parsed flags and the argv they came from (the process's own when `argv` is None)."""
    from training.driver import quiet

    quiet.install()
    argv = sys.argv[1:] if argv is None else argv
    return parser.parse_args(argv), argv


def refuse(message: str) -> int:
    """Print why the flags are refused and return the exit status for it."""
    print(f"error: {message}", file=sys.stderr)
    return 2
