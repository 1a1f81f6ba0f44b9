"""A step whose micro-batches hold no trained token is named with the reason, never a silent 0."""

from __future__ import annotations

import torch

from training.data.packing import Batch
from training.model.loss import IGNORE_INDEX
from training.run.untrained import UntrainedSteps, warning


def _micro(trained: int) -> Batch:
    labels = torch.full((2, 8), IGNORE_INDEX)
    labels[1, :trained] = 7
    return Batch(torch.zeros(2, 8, dtype=torch.long), labels)


def test_only_steps_without_a_trained_token_are_named():
    seen = UntrainedSteps(torch.device("cpu"))
    seen.observe(11, [_micro(0), _micro(0)])
    seen.observe(12, [_micro(0), _micro(1)])  # one token in the second micro-batch trains
    seen.observe(13, [(torch.zeros(1, 4), torch.full((1, 4), IGNORE_INDEX))])  # (inputs, labels)
    assert seen.collect() == [11, 13]
    assert seen.collect() == []  # each window once


def test_the_warning_says_why_and_what_to_do():
    line = warning([11, 13], 27)
    assert line.startswith("WARNING: steps 11, 13 trained no token")
    assert "--seq-len 27 cuts the answers off" in line and "raise --seq-len" in line
