"""The dev stack's program under mocks, run once per test module that asks for it."""

from __future__ import annotations

import pytest

from tests.infra.harness import run_program
from tests.infra.test_program import DEV


@pytest.fixture(scope="module")
def dev():
    return run_program(DEV)
