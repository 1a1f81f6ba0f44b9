"""The planner for LoRA on an L4's budget: a replicated frozen base when it fits, the larger
micro-batch first (a smaller loss chunk before a smaller micro-batch), and estimates held to
the H200 LoRA rows (bench/runs/2026-12-02 and 2026-12-03)."""

from __future__ import annotations

import dataclasses

import pytest

from bench.calibrate import HIGH_LORA, LORA_LOW, centred, label, recorded_rows
from training.config import ConfigError, TrainConfig
from training.model.lora import LoraSpec, count_on_meta
from training.model.model import model_config
from training.step import memory
from training.step.engine import plan_step
from training.step.mesh import MeshLayout
from tests.conftest import REPO

GIB = 2**30
LORA_ROWS = [r for r in recorded_rows(sorted((REPO / "bench/runs").rglob("*.json")))
             if r["inputs"].get("trainable_params")]


def _config(model: str, seq: int, budget_gib: float, shard: int = 1, sequences: int = 8,
            micro_batch: tuple[int, int] | None = None) -> TrainConfig:
    """LoRA rank 16; the batch planned from 8 sequences a GPU, or `micro_batch` (size, accum)."""
    batch = ({"micro_batch_size": micro_batch[0], "grad_accum": micro_batch[1]} if micro_batch
             else {"tokens_per_step": shard * sequences * seq})
    return TrainConfig(model=model, seq_len=seq, num_workers=shard, lora_rank=16,
                       lora_alpha=32.0, memory_budget_gib=budget_gib, **batch).validated()


def _plan(model: str, seq: int, budget_gib: float, shard: int = 1, **batch):
    cfg = _config(model, seq, budget_gib, shard, **batch)
    mc = model_config(model)
    spec = LoraSpec.from_config(cfg)
    layout = MeshLayout((tuple(range(shard)),), "test")
    return plan_step(cfg, mc, count_on_meta(mc, spec), spec, layout, int(budget_gib * GIB),
                     on_gpu=True)


def _footprint(model: str, seq: int, budget_gib: float) -> tuple[TrainConfig, memory.Footprint]:
    """One GPU, the base replicated, as plan_step sees it."""
    cfg = _config(model, seq, budget_gib)
    mc = model_config(model)
    num_params, trainable = count_on_meta(mc, LoraSpec.from_config(cfg))
    return cfg, memory.Footprint(mc, num_params, 1, int(budget_gib * GIB), compiled=True,
                                 trainable_params=trainable, replicated_base=True)


def test_7b_lora_at_2048_tokens_fits_an_l4_at_micro_batch_2_and_no_smaller_chunk_fits_4():
    # Under 22 GiB (23 for the measurement) on an H200 (bench/runs/2026-12-02/chunk-ab-*.json):
    # mb 2 with the flag's 2,048-token chunks peaked at 19.48 GiB (inside 90% of 22), 11,770
    # tokens/s; with 1,024-token chunks 19.18 GiB, 11,696; mb 1 ran 9,090.
    plan = _plan("qwen2.5-7b", 2048, 22)
    assert plan.replicate_base and plan.activation_checkpointing
    assert (plan.micro_batch_size, plan.grad_accum, plan.loss_chunk_tokens) == (2, 4, 2048)
    cfg, fp = _footprint("qwen2.5-7b", 2048, 22)
    # at mb 4 a checkpointed layer's recompute is the peak: a smaller chunk does not help
    four = dict(micro_batch=4, grad_accum=2, checkpointing=True)
    assert not any(memory.fits(fp, cfg, **four, loss_chunk_tokens=c) for c in (2048, 1024, 512))


def test_7b_lora_at_512_tokens_takes_the_larger_micro_batch_with_checkpointing():
    # mb 8 with checkpointing: 12,950 tokens/s at 19.00 GiB with 1,024-token chunks; mb 4:
    # 9,536; mb 1 without: 2,824 (H200, planned-chunk-lora-l4-512.json and the grid)
    plan = _plan("qwen2.5-7b", 512, 22)
    assert (plan.micro_batch_size, plan.grad_accum, plan.activation_checkpointing) == (8, 1, True)


def test_full_fine_tuning_and_the_unfused_loss_keep_the_flag_s_chunk():
    cfg, fp = _footprint("qwen2.5-1.5b", 2048, 22)
    full = dataclasses.replace(fp, trainable_params=None, replicated_base=False)
    assert memory.loss_chunks(dataclasses.replace(cfg, lora_rank=0), full) == (2048,)
    assert memory.loss_chunks(dataclasses.replace(cfg, loss_chunk_tokens=0), fp) == (0,)
    assert memory.loss_chunks(cfg, fp) == (2048, 1024, 512)
    assert memory.loss_chunks(dataclasses.replace(cfg, loss_chunk_tokens=1000), fp) == (1000,)


def test_an_explicit_lora_micro_batch_gets_the_chunk_that_fits_and_is_refused_past_the_smallest():
    # Qwen3-8B at one micro-batch of 2,048 tokens: the loss's moment is the peak, and its
    # 151,936-word head's 2,048-token chunk does not fit 90% of 22 GiB (H200, 2026-12-03:
    # 19.33 GiB measured with 1,024-token chunks, family-lora-qwen3-8b.json)
    plan = _plan("qwen3-8b", 2048, 22, micro_batch=(1, 8))
    assert (plan.micro_batch_size, plan.grad_accum, plan.activation_checkpointing,
            plan.loss_chunk_tokens) == (1, 8, True, 1024)
    with pytest.raises(ConfigError, match="micro-batch 8 at --seq-len 2048 needs about"):
        _plan("qwen2.5-7b", 2048, 22, micro_batch=(8, 1))


def test_over_several_gpus_the_base_stays_sharded_and_one_gpu_too_small_is_refused():
    # which of replicating and sharding is faster over PCIe is the step model's to say
    plan = _plan("qwen2.5-7b", 512, 14, shard=4)  # a quarter of the 14.3 GiB base on each
    assert not plan.replicate_base
    with pytest.raises(ConfigError, match="needs about"):
        _plan("qwen2.5-7b", 512, 14)  # the whole base on one 14 GiB GPU


@pytest.mark.skipif(not LORA_ROWS, reason="no LoRA calibration rows recorded")
@pytest.mark.parametrize("row", LORA_ROWS, ids=label)
def test_lora_estimates_are_inside_minus_10_plus_5_percent_of_the_measured_peak(row):
    # the calibration grid and bench.lora's rows: Llama-3.1-8B, Qwen3-8B, Ministral-8B and
    # Gemma-3-12B at seq 2048 among them (bench/runs/2026-12-03/family-lora-*.json)
    error = memory.estimate_from(row["inputs"]) / (row["peak_gib"] * GIB) - 1
    assert LORA_LOW <= error <= HIGH_LORA, f"{label(row)}: {error:+.1%}"


def _gemma(checkpointing: bool, chunk: int, micro_batch: int) -> int:
    cfg, fp = _footprint("gemma3-12b", 2048, 40)
    return memory.estimate_bytes(fp, micro_batch=micro_batch, seq_len=2048, grad_accum=2,
                                 reduce_dtype="fp32", checkpointing=checkpointing, zero2=False,
                                 loss_chunk_tokens=chunk)


def test_a_smaller_loss_chunk_saves_memory_only_while_the_loss_is_the_peak():
    # Gemma 3's 262,208-word head: a 1,024-token chunk's fp32 logits and bf16 gradient are
    # 1.5 GiB. Without checkpointing they sit beside every saved activation; with it, beside
    # the layers' inputs only (one micro-batch of 2,048 tokens: the loss is the peak) ...
    chunk = 1024 * 262208 * 6
    for checkpointing in (False, True):
        saved = _gemma(checkpointing, 2048, 1) - _gemma(checkpointing, 1024, 1)
        assert saved == pytest.approx(memory.STATIC_FACTOR * chunk, abs=8)
    # ... and a checkpointed layer is recomputed after they are freed: at 4 x 2,048 tokens its
    # activations outweigh a 1,024-token chunk's, so halving the chunk saves nothing
    assert _gemma(True, 1024, 4) == _gemma(True, 512, 4)


def test_centred_fit_puts_the_errors_in_the_middle_of_the_band():
    import numpy as np

    factors = np.linspace(1.0, 2.0, 101)[:, None]
    activations = np.array([1.0, 2.0, 4.0]) * GIB
    peak = np.array([20.0, 21.0, 24.0]) * GIB
    rest = np.array([1.5, 3.0, 6.0]) * GIB  # exactly 1.5 x activations
    errors = (factors * activations - rest) / peak
    best = errors[np.argmin(centred(errors))]
    assert LORA_LOW <= best.min() and best.max() <= HIGH_LORA
    assert abs((best.max() + best.min()) / 2 - (LORA_LOW + HIGH_LORA) / 2) < 0.01
