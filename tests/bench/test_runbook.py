"""The one GPU runbook asks only for benchmark variants that exist."""

from __future__ import annotations

import re

from bench.benchmark import REFERENCES, VARIANTS
from tests.conftest import REPO


def test_runbook_variants_exist():
    text = (REPO / "bench/device-run.sh").read_text()
    asked = {v for group in re.findall(r"--variants ([\w,-]+)", text) for v in group.split(",")}
    assert asked, "the runbook names no variants"
    assert asked <= {*REFERENCES, *VARIANTS}, asked - {*REFERENCES, *VARIANTS}


def test_runbook_benchmark_modules_accept_its_flags():
    """Every `python3 -m bench.<module> ...` line of the runbook parses with that module's own
    parser (shell variables replaced by what a CPU rehearsal passes)."""
    import importlib
    import shlex

    text = (REPO / "bench/device-run.sh").read_text().replace("\\\n", " ")
    calls = re.findall(r"python3 -m (bench\.\w+) (.*?)(?: 2>&1|$)", text, flags=re.M)
    assert {m for m, _ in calls} >= {"bench.precision", "bench.calibrate", "bench.checkpoints",
                                     "bench.loading"}
    for module, flags in calls:
        for var, value in (('"$MODEL"', "tiny"), ('"$LARGE"', "tiny"), ('"$SEQ"', "32"),
                           ("$OUT", "/tmp")):
            flags = flags.replace(var, value)
        importlib.import_module(module).build_parser().parse_args(shlex.split(flags))
