"""Drop Ray's internal chatter from a local run's terminal; keep our progress lines and errors.

Ray forwards every worker's log lines to the driver's stdout/stderr. A handful of them are noise
to a user of this job (Ray 2.58's PlacementGroupCleaner "Failed to query" loop, per-report echoes,
actor-restart notes). This filters those lines by pattern and passes everything else through.
"""

from __future__ import annotations

import io
import re
import sys

NOISE = re.compile("|".join([
    r"PlacementGroupCleaner",
    r"Reporting training result \d+",
    r"Setting up process group for",
    r"core_worker\.cc:\d+: Actor with class name",
    r"Started training worker group of size",
    r"- \(ip=.*\) world_rank=",
    r"Checkpoint successfully created at",
    r"generated new fontManager",
    r"Ray deduplicates logs by default",
    r"Started a local Ray instance",
    r"\[repeated \d+x across cluster\]\s*$",
]))


class LineFilter(io.TextIOBase):
    """A text stream that forwards whole lines not matching NOISE to `target`."""

    def __init__(self, target):
        self.target = target
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if not NOISE.search(line):
                self.target.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return not self.target.closed and self.target.isatty()

    def fileno(self) -> int:
        return self.target.fileno()


def install() -> None:
    if not isinstance(sys.stdout, LineFilter):
        sys.stdout = LineFilter(sys.stdout)
        sys.stderr = LineFilter(sys.stderr)
