"""Shared test helpers: where ../shared lives, and skipping when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
KUBERAY_CRDS = SHARED / "reference" / "kuberay-v1.7.0"
SHARED_NCCL = SHARED / "fixtures" / "nccl"
NCCL_FIXTURES = REPO / "tests" / "fixtures" / "nccl"


def need(path: Path) -> Path:
    """`path`, or skip the test: upstream files are read from ../shared, never committed here."""
    if not path.exists():
        pytest.skip(f"{path} is absent (upstream reference files live in ../shared, not in this repo)")
    return path
