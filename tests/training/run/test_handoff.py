"""The run summary between rank 0's loop and the driver: every reported plan and link field
reaches it, and it carries the run's rates rather than the last log window's."""

from __future__ import annotations

import dataclasses

from training.network.device_time import LINK_FIELDS
from training.run.handoff import RunSummary
from training.run.trainer import summarize
from training.step.engine import Plan


def test_every_plan_and_link_field_is_a_summary_key():
    keys = {f.name for f in dataclasses.fields(RunSummary)}
    assert {f.name for f in dataclasses.fields(Plan)} <= keys and set(LINK_FIELDS) <= keys


def test_the_summary_takes_the_runs_rates_and_survives_the_run_directory():
    row = {"step": 7, "loss": 1.5, "first_loss": 4.0, "tokens_per_s": 10.0,
           "run_tokens_per_s": 20.0, "run_tokens_per_s_with_checkpoints": 15.0,
           "cold_start_marks": {"first_step": 3.0}, "world_size": 2, "mesh": "1x2",
           "lr": 1e-3, "num_params": 99}  # row-only keys stay out
    s = summarize(row, "s3://b/run/hf_model")
    assert (s.steps, s.last_loss, s.tokens_per_s, s.tokens_per_s_with_checkpoints) == (
        7, 1.5, 20.0, 15.0)
    assert s.cold_start == {"first_step": 3.0} and s.export_path == "s3://b/run/hf_model"
    assert RunSummary.from_json(s.to_json()) == s
    resumed_done = summarize({"step": 8, "first_loss": 4.0, "world_size": 2}, None)
    assert resumed_done.last_loss is None and resumed_done.steps == 8  # no step ran
