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


T = 10_000_000  # adapters


def test_a_replicated_lora_base_moves_no_base_bytes_and_a_sharded_one_two_per_gather():
    lora = dict(trainable=T, zero2=False, grad_accum=3)
    replicated = sm.predict(plan(**lora, replicated_base=True), 0.1, SLOW)
    bigger_base = sm.predict(plan(**lora, replicated_base=True, params=4 * P), 0.1, SLOW)
    assert bigger_base.shard_link_gb_per_rank == replicated.shard_link_gb_per_rank
    sharded = sm.predict(plan(**lora), 0.1, SLOW)
    gathers = 2 * 3  # forward and backward of each micro-batch under ZeRO-3
    base_gb = (P - T) / 2 / 1e9  # a shard group of 2 gathers half of the frozen base
    assert sharded.shard_link_gb_per_rank - replicated.shard_link_gb_per_rank == \
        pytest.approx(gathers * 2 * base_gb)


def test_lora_reduces_what_full_fine_tuning_of_its_adapters_alone_would():
    hsdp = dict(replicas=2, shard=2, zero2=False)
    links = sm.Links(2.0, 1.0, separate=True)
    adapters_only = sm.predict(plan(**hsdp, params=T), 0.1, links)
    for replicated in (False, True):
        lora = sm.predict(plan(**hsdp, trainable=T, replicated_base=replicated), 0.1, links)
        assert lora.replicate_link_gb_per_rank == adapters_only.replicate_link_gb_per_rank
    full = sm.predict(plan(**hsdp), 0.1, links)
    assert full.replicate_link_gb_per_rank == pytest.approx(P / T * lora.replicate_link_gb_per_rank)


def test_full_fine_tuning_predictions_are_the_recorded_ones():
    """The rows bench/MODEL.md recorded before LoRA was modelled, reproduced."""
    from tests.conftest import REPO

    recorded = json.loads((REPO / "bench/runs/2026-12-01/step-model-l4.json").read_text())
    now = {r["name"]: r for r in sm.g6_predictions(0.5, 10.0, 4.0, 8 * 16 * 2048)}
    for row in recorded["g6.12xlarge-x2"]["rows"]:
        assert now[row["name"]]["step_s"] == pytest.approx(row["step_s"], rel=1e-12)
    one_trained = plan(trainable=P, checkpointing=True)  # nothing frozen: full fine-tuning
    assert sm.predict(one_trained, 0.3, SLOW) == sm.predict(plan(checkpointing=True), 0.3, SLOW)


def test_g6_preset_plans_the_7b_lora_recipe_both_ways_and_names_the_faster():
    rows = {r["name"]: r for r in sm.g6_predictions(0.5, 10.0, 4.0, 8 * 16 * 2048)}
    replicated, sharded = rows["7B LoRA r16, base replicated"], rows["7B LoRA r16, base sharded"]
    for row in (replicated, sharded):
        assert row["fits"] and row["estimate_gib"] <= 0.9 * sm.L4_BUDGET_GIB
        assert row["plan"]["micro_batch"] * row["plan"]["grad_accum"] == 16
    # the replicated base leaves room for a smaller micro-batch only, and moves 40x fewer bytes
    assert replicated["plan"]["micro_batch"] < sharded["plan"]["micro_batch"]
    assert replicated["shard_link_gb_per_rank"] < sharded["shard_link_gb_per_rank"] / 40
    assert replicated["step_s"] < sharded["step_s"]
    assert "base replicated' predicted faster" in sm.lora_winner(list(rows.values()))
    slow = {r["name"]: r for r in sm.g6_predictions(0.5, 2.0, 4.0, 8 * 16 * 2048)}
    gap = lambda r: r["7B LoRA r16, base sharded"]["step_s"] / r["7B LoRA r16, base replicated"]["step_s"]
    assert gap(slow) > gap(rows) + 0.05  # a slower PCIe link costs the sharded base's gathers


def test_the_preset_counts_a_steps_flops_as_the_jobs_mfu_does():
    """One definition (training.step.metrics.model_flops_per_token): an untied model's input
    embedding is a lookup, no compute (the 7B's 545M of 7.6B parameters); a tied one's matrix
    is the LM head's and counts (the 1.5B). Counting the embedding put the 7B's compute 7% high."""
    from training.model.model import model_config
    from training.step.metrics import flops_per_token, model_flops_per_token

    rate = sm.PEAK_BF16_TFLOPS["NVIDIA L4"] * 1e12 * 0.5
    rows = {r["name"]: r for r in sm.g6_predictions(0.5, 10.0, 4.0, 8 * 16 * 2048)}
    for name, model in (("7B LoRA r16, base sharded", "qwen2.5-7b"),
                        ("ours, fp32 reduce, 262,144 tokens/step", "qwen2.5-1.5b")):
        row, mc = rows[name], model_config(model)
        plan = sm.StepPlan(**row["plan"])
        job = model_flops_per_token(mc, plan.params, plan.seq_len, plan.trainable)
        assert row["compute_s"] == pytest.approx(
            sm.compute_s(plan, job, rate) * plan.grad_accum, rel=1e-12)
        counted = flops_per_token(plan.params, plan.layers, mc.hidden_size, plan.seq_len,
                                  frozen=plan.params - plan.reduced)  # embedding as a matmul
        if mc.tie_word_embeddings:
            assert job == counted
        else:
            assert job < counted / 1.05


def test_a_lora_plan_that_cannot_fit_is_named_and_left_out_of_the_choice(monkeypatch):
    monkeypatch.setattr(sm, "L4_BUDGET_GIB", 16)  # the 14.3 GiB base whole leaves too little
    links = sm.Links(10.0, 1.0, separate=True)
    rows = [sm._predicted(name, plan, links, chosen, 60e12)
            for name, plan, chosen in sm._lora_on_l4(8 * 16 * 2048, 2048)]
    replicated = next(r for r in rows if r["name"] == "7B LoRA r16, base replicated")
    assert not replicated["fits"] and "needs about" in replicated["why"]
    assert sm.lora_winner(rows) == "only '7B LoRA r16, base sharded' fits"
