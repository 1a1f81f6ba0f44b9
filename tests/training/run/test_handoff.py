"""The run summary between rank 0's loop and the driver: every reported plan and link field
reaches it from the run's facts, it carries the run's rates rather than the last log window's,
and the facts stay out of the metrics row."""

from __future__ import annotations

import dataclasses

from training.network.device_time import LINK_FIELDS
from training.run.facts import LinkShares, MetricsRow, RunFacts
from training.run.handoff import RunSummary
from training.step.engine import Load, Plan

PLAN = Plan(activation_checkpointing=False, reshard_after_forward=True, compile=False,
            micro_batch_size=2, grad_accum=3, mesh="1x2", reduce_dtype="fp32",
            accum_dtype="fp32", loss_chunk_tokens=2048)


def _facts() -> RunFacts:
    return RunFacts(world_size=2, resumed_from_step=4, nccl_transport="socket", nccl_nodes=1,
                    efa_preflight="skipped", num_params=99, plan=PLAN, waited_for_workers_s=1.5,
                    load=Load(2.0, [1.0, 1.1]), link=LinkShares(allgather_busbw_gbps=3.0),
                    cold_start_marks={"train_started": 1.0})


def test_every_plan_and_link_field_is_a_summary_key():
    keys = {f.name for f in dataclasses.fields(RunSummary)}
    assert {f.name for f in dataclasses.fields(Plan)} <= keys and set(LINK_FIELDS) <= keys
    summary = RunSummary.from_run(_facts(), MetricsRow(step=1)).to_dict()
    assert {k: summary[k] for k in dataclasses.asdict(PLAN)} == dataclasses.asdict(PLAN)


def test_the_summary_takes_the_runs_rates_and_facts_and_survives_the_run_directory():
    facts = _facts()
    facts.link.update({"comm_share": 0.25, "exposed_comm_share": 0.1, "profiled_step_ms": 9.0})
    facts.first_step_done(now=13.0, run_started_at=3.0)
    row = MetricsRow(step=7, loss=1.5, first_loss=4.0, tokens_per_s=10.0, run_tokens_per_s=20.0,
                     run_tokens_per_s_with_checkpoints=15.0, lr=1e-3)
    s = RunSummary.from_run(facts, row, export_path="s3://b/run/hf_model")
    assert (s.steps, s.last_loss, s.tokens_per_s, s.tokens_per_s_with_checkpoints) == (
        7, 1.5, 20.0, 15.0)
    assert s.cold_start == {"train_started": 1.0, "first_step": 13.0}
    assert (s.time_to_first_step_s, s.resumed_from_step, s.load_s, s.comm_share) == (
        10.0, 4, 2.0, 0.25)
    assert s.export_path == "s3://b/run/hf_model" and s.mesh == "1x2"
    assert RunSummary.from_json(s.to_json()) == s
    resumed_done = RunSummary.from_run(facts, MetricsRow(step=8, first_loss=4.0), stopped="nan")
    assert resumed_done.last_loss is None and resumed_done.steps == 8  # no step ran
    assert resumed_done.stopped == "nan"


def test_a_metrics_row_holds_no_run_fact():
    facts = {f.name for f in dataclasses.fields(RunFacts)} | set(LINK_FIELDS)
    assert not facts & MetricsRow(step=1).to_dict().keys()
