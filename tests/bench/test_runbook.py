"""The one GPU runbook asks only for benchmark variants that exist."""

from __future__ import annotations

import re

from bench.benchmark import REFERENCE, VARIANTS
from tests.conftest import REPO


def test_runbook_variants_exist():
    text = (REPO / "bench/device-run.sh").read_text()
    asked = {v for group in re.findall(r"--variants ([\w,-]+)", text) for v in group.split(",")}
    assert asked, "the runbook names no variants"
    assert asked <= {REFERENCE, *VARIANTS}, asked - {REFERENCE, *VARIANTS}
