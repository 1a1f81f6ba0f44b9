"""The job's command line both ways: render(cfg) parses back to cfg."""

from __future__ import annotations

import dataclasses

import pytest

from training.driver.cli import parse
from training.config import TestHooks, TrainConfig
from training.flags import render


@pytest.mark.parametrize("cfg", [
    TrainConfig(),
    TrainConfig(model="Qwen/Qwen2.5-1.5B", steps=500, lr=3e-5, max_failures=2, compile=False,
                reshard_after_forward=True, memory_budget_gib=22.0, expect_transport="efa",
                on_fallback="warn", export=True, use_gpu=True, address="auto",
                storage_path="s3://bucket/runs", name="ray-train-dev-run-1234abcd"),
    TrainConfig(activation_checkpointing=True, grad_clip=0.0, warmup_steps=0,
                test_hooks=TestHooks(fault_at_step=3)),
], ids=["defaults", "cluster", "edges"])
def test_parse_of_render_is_identity(cfg):
    assert parse(render(cfg)) == cfg


def test_render_names_only_what_differs_from_the_defaults():
    assert render(TrainConfig()) == []
    assert render(dataclasses.replace(TrainConfig(), compile=False, steps=7)) == [
        "--steps", "7", "--no-compile"]
