"""The step-time model: its rules, its check against benchmark rows, and the 2 x g6.12xlarge preset."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench import step_model as sm

P, L = 1_000_000_000, 20


def plan(**kw) -> sm.StepPlan:
    base = dict(params=P, layers=L, replicas=1, shard=2, reduce_dtype="fp32", zero2=True,
                micro_batch=4, grad_accum=1, seq_len=2048)
    return sm.StepPlan(**{**base, **kw})


SLOW = sm.Links(shard_gbps=2.0, replicate_gbps=2.0, separate=False)


def test_bytes_per_link_follow_the_mesh_and_reduce_dtype():
    fsdp = sm.predict(plan(), 0.1, SLOW)
    assert fsdp.shard_link_gb_per_rank == pytest.approx((2 + 4) * P / 2 / 1e9)  # gather + RS
    assert fsdp.replicate_link_gb_per_rank == 0
    bf16 = sm.predict(plan(reduce_dtype="bf16"), 0.1, SLOW)
    assert bf16.shard_link_gb_per_rank == pytest.approx((2 + 2) * P / 2 / 1e9)
    replicated = sm.predict(plan(replicas=2, shard=1), 0.1, SLOW)  # 2 replicas of 1 GPU
    assert replicated.shard_link_gb_per_rank == 0
    assert replicated.replicate_link_gb_per_rank == pytest.approx(4 * P / 1e9)


def test_accumulation_adds_compute_only_while_the_reference_pays_the_link_every_micro_batch():
    one, four = (sm.predict(plan(grad_accum=k), 0.5, SLOW) for k in (1, 4))
    assert four.step_s - one.step_s == pytest.approx(3 * 0.5)  # comm once per step
    assert four.shard_link_gb_per_rank == one.shard_link_gb_per_rank
    ref = sm.predict(plan(grad_accum=4, zero2=False, reduce_every_micro_batch=True), 0.5, SLOW)
    assert ref.shard_link_gb_per_rank == pytest.approx(4 * (2 * 2 + 4) * P / 2 / 1e9)
    assert ref.step_s > 2 * four.step_s


def test_compute_bound_step_hides_communication_but_one_layer():
    fast = sm.Links(shard_gbps=1e6, replicate_gbps=None, separate=False)
    pred = sm.predict(plan(), 1.0, fast)
    assert pred.step_s == pytest.approx(1.0, rel=1e-4) and pred.exposed_comm_s < 1e-3
    slow = sm.predict(plan(), 1e-6, SLOW)  # communication-bound: the link time itself
    assert slow.step_s == pytest.approx(slow.shard_link_gb_per_rank / 2.0, rel=1e-3)


def test_check_compares_each_benchmark_row_with_its_own_inputs(tmp_path):
    row = {"variant": "ours-hsdp", "mesh": "2x1", "reduce_dtype": "bf16",
           "reshard_after_forward": False, "activation_checkpointing": False,
           "micro_batch_size": 4, "grad_accum": 2, "compute_ms_per_micro_batch": 200.0,
           "bandwidth": {"allgather_busbw_gbps": None, "allreduce_busbw_gbps": 3.0}}
    expected = sm.predict(plan(replicas=2, shard=1, reduce_dtype="bf16", grad_accum=2, layers=28),
                          0.2, sm.Links(None, 3.0, separate=False)).step_s
    result = {"env": {"num_params": P, "nccl_transport": "socket-fallback"},
              "settings": {"seq_len": 2048, "model": "qwen2.5-1.5b"},
              "rows": [{**row, "step_time_ms": 1000 * expected / 1.25},
                       {"variant": "reference", "step_time_ms": 900.0}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    checked = sm.check([path])
    assert len(checked["rows"]) == 1  # the reference carries no compute measurement
    assert checked["rows"][0]["error"] == pytest.approx(0.25)
    assert checked["max_abs_error"] == pytest.approx(0.25)
    out, md = tmp_path / "model.json", tmp_path / "MODEL.md"
    assert sm.main(["--check", str(path), "--preset", "g6.12xlarge-x2",
                    "--json-out", str(out), "--md-out", str(md)]) == 0
    assert set(json.loads(out.read_text())) == {"check", "g6.12xlarge-x2"}
    assert "max |error| 25.0%" in md.read_text() and "--preset g6.12xlarge-x2" in md.read_text()


def test_g6_preset_uses_the_planner_and_predicts_the_published_sample_and_our_gain():
    rows = {r["name"]: r for r in sm.g6_predictions(0.5, 10.0, 4.0, 8 * 16 * 2048)}
    sample = rows["reference, the AWS sample's own (seq 128, mb 1)"]
    assert sample["steps_per_s"] == pytest.approx(sm.AWS_SAMPLE_STEPS_PER_S, rel=0.10)
    ours = rows["ours, bf16 reduce, 262,144 tokens/step"]
    reference = rows["reference at 262,144 tokens/step (mb 1, accumulating)"]
    assert ours["plan"]["micro_batch"] * ours["plan"]["grad_accum"] == 16
    fp32 = rows["ours, fp32 reduce, 262,144 tokens/step"]["plan"]
    # bf16 accumulation buffers are half the size: never a more frugal plan than fp32's
    assert ours["plan"]["zero2"] >= fp32["zero2"]
    assert ours["plan"]["checkpointing"] <= fp32["checkpointing"]
    assert ours["tokens_per_s_per_gpu"] > 1.5 * reference["tokens_per_s_per_gpu"]
    assert dataclasses.asdict(sm.StepPlan(**ours["plan"])) == ours["plan"]
