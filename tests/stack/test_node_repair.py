"""gpuNodeAutoRepair: on unless a stack turns it off, read as a boolean, refused where it would
do nothing (an existing cluster's node groups are not the stack's)."""

from __future__ import annotations

import pytest

from stack.config import ConfigError
from stack.parse import parse


def test_auto_repair_is_on_unless_the_stack_turns_it_off():
    assert parse({}, "us-west-2").gpu_node_auto_repair is True  # Pulumi.yaml's default
    assert parse({"gpuNodeAutoRepair": "false"}, "us-west-2").gpu_node_auto_repair is False


@pytest.mark.parametrize("raw, message", [
    ({"gpuNodeAutoRepair": "maybe"}, "gpuNodeAutoRepair: cannot read 'maybe'"),
    ({"gpuNodeAutoRepair": "false", "existingClusterName": "shared-gpu"},
     "gpuNodeAutoRepair: false does nothing with existingClusterName"),
])
def test_a_bad_gpu_node_auto_repair_is_refused_by_key(raw, message):
    with pytest.raises(ConfigError) as e:
        parse(raw, "us-west-2")
    assert any(p.startswith(message) for p in e.value.problems), e.value.problems
