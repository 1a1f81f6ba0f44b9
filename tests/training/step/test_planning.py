"""Pure planning pieces: the mesh choice, the memory estimate and batch planner, the
resolved plan, the new settings' validation, and the link report."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from training.network.bandwidth import bus_factor
from training.config import ConfigError, TrainConfig
from training.network.device_time import link_report
from training.step.engine import Plan, resolve_plan
from training.step.memory import (FIXED_GIB, HEADROOM, NCCL_GIB, BatchPlan, Footprint,
                                  estimate_bytes, estimate_parts, fits, plan_batch)
from training.step.mesh import choose_layout
from training.model.model import model_config

QWEN = 1_543_714_304
GIB = 2**30



def _batch(plan: BatchPlan) -> tuple[int, int]:
    return plan.micro_batch_size, plan.grad_accum

def test_mesh_is_one_replica_per_node_when_nodes_match_and_plain_fsdp_otherwise():
    # Ray may hand out ranks interleaved across nodes: shard groups still stay on one node.
    two_nodes = ["a", "b", "a", "b", "a", "b", "a", "b"]
    layout = choose_layout(two_nodes, None)
    assert layout.grid == ((0, 2, 4, 6), (1, 3, 5, 7)) and layout.shape == "2x4"
    assert "per node" in layout.reason
    assert choose_layout(["a"] * 4, None).shape == "1x4"  # one node: plain FSDP
    uneven = choose_layout(["a", "a", "a", "b"], None)
    assert uneven.shape == "1x4" and "unequal" in uneven.reason
    forced = choose_layout(["a"] * 4, 2)  # the CPU test's 2 x 2 on one host
    assert forced.grid == ((0, 1), (2, 3)) and forced.reason == "set by --hsdp-replicas"
    assert choose_layout(["a", "a"], 2).shape == "2x1"  # the GPU machine: 2 replicas of 1 GPU
    with pytest.raises(ConfigError, match="--hsdp-replicas must divide the 4 workers"):
        choose_layout(["a"] * 4, 3)


def _l4(shard: int, **kw) -> tuple[TrainConfig, Footprint]:
    cfg = TrainConfig(model="qwen2.5-1.5b", seq_len=2048, num_workers=8, **kw)
    return cfg, Footprint(model_config("qwen2.5-1.5b"), QWEN, shard, 22 * GIB, compiled=True,
                          world=8)


@pytest.mark.parametrize("reduce_dtype", ["fp32", "bf16"])
def test_planner_fills_but_never_exceeds_the_l4_budget(reduce_dtype):
    # 2 x g6.12xlarge: 8 workers, HSDP shards over the 4 GPUs of a node, 22 GiB usable per L4.
    cfg, fp = _l4(4, tokens_per_step=8 * 16 * 2048, reduce_dtype=reduce_dtype)
    micro, accum = _batch(plan_batch(cfg, fp, world=8))
    assert micro * accum == 16  # exactly the global batch: 16 sequences per worker
    checkpointing = not fits(fp, cfg, micro_batch=micro, grad_accum=accum)
    need = estimate_bytes(fp, micro_batch=micro, seq_len=2048, grad_accum=accum,
                          reduce_dtype=reduce_dtype, checkpointing=checkpointing, zero2=False)
    assert need <= HEADROOM * fp.limit_bytes
    bigger = next((m for m in range(micro + 1, 17) if 16 % m == 0), None)
    assert bigger is None or not fits(fp, cfg, micro_batch=bigger, grad_accum=16 // bigger,
                                      checkpointing=checkpointing)


def test_planner_counts_the_unsharded_gradients_that_accumulation_keeps():
    cfg, fp = _l4(4)

    def static(**kw):
        return estimate_parts(fp, micro_batch=1, seq_len=2048, checkpointing=False, zero2=False,
                              **kw).static

    one = static(grad_accum=1, reduce_dtype="fp32")
    assert static(grad_accum=4, reduce_dtype="fp32") - one == 4 * QWEN
    assert static(grad_accum=4, reduce_dtype="bf16") - one == 2 * QWEN
    # fp32 accumulation under a bf16 wire keeps fp32 unsharded gradients
    assert static(grad_accum=4, reduce_dtype="bf16", accum_dtype="fp32") - one == 4 * QWEN


def test_estimate_counts_the_fused_loss_and_what_lies_outside_torch():
    cfg, fp = _l4(4)
    shape = dict(micro_batch=1, seq_len=2048, grad_accum=1, reduce_dtype="bf16",
                 checkpointing=False, zero2=False)
    parts = estimate_parts(fp, **shape)
    state = 16 * QWEN / 4
    # Qwen's 151,936-word head: a 2,048-token chunk's fp32 logits + bf16 gradient (1.7 GiB,
    # only while the loss runs), and two fp32 copies of the head's gradient: about 3.5 GiB
    # beyond the sharded state
    assert 1.7 * GIB < parts.transient < 1.8 * GIB
    assert 3.4 * GIB < parts.static + parts.transient - state < 3.6 * GIB
    assert parts.outside == (FIXED_GIB + NCCL_GIB) * GIB  # 8 workers: NCCL has peers
    alone = estimate_parts(dataclasses.replace(fp, world=1), **shape)
    assert alone.outside == FIXED_GIB * GIB
    unfused = estimate_parts(fp, **shape, loss_chunk_tokens=0)
    assert unfused.transient == 0  # the whole micro-batch's logits, kept for backward:
    assert unfused.static - state > 2.5 * GIB * 4 / 3.5
    eager = estimate_parts(dataclasses.replace(fp, compiled=False), **shape)
    assert eager.activations == parts.activations and eager.total > parts.total


def test_planner_checkpoints_activations_only_when_no_micro_batch_fits_without():
    cfg, fp = _l4(1, tokens_per_step=2 * 8 * 2048)  # no sharding: 24.7 GB of state alone
    fp = dataclasses.replace(fp, limit_bytes=40 * GIB)
    micro, accum = _batch(plan_batch(dataclasses.replace(cfg, num_workers=2), fp, world=2))
    assert not fits(fp, cfg, micro_batch=1, grad_accum=8)
    assert fits(fp, cfg, micro_batch=micro, grad_accum=accum, checkpointing=True)
    assert micro > 1  # checkpointing buys a larger micro-batch than 1
    cpu = dataclasses.replace(fp, limit_bytes=None)
    assert plan_batch(cfg, cpu, world=2) == BatchPlan(8, 1)  # no limit: the whole batch at once
    assert plan_batch(TrainConfig(micro_batch_size=3, grad_accum=5), cpu, world=2) == BatchPlan(3, 5)


def test_plan_resolves_batch_checkpointing_zero2_and_explicit_settings_win():
    config = model_config("qwen2.5-1.5b")
    cfg = TrainConfig(model="qwen2.5-1.5b", seq_len=2048, micro_batch_size=4)

    def plan(limit, c=cfg, on_gpu=True):
        return resolve_plan(c, Footprint(config, QWEN, 2, limit), 2, "1x2", on_gpu=on_gpu)

    base = functools.partial(Plan, micro_batch_size=4, grad_accum=1, mesh="1x2", reduce_dtype="fp32",
                             accum_dtype="fp32", loss_chunk_tokens=2048)
    assert plan(141 * GIB) == base(activation_checkpointing=False, reshard_after_forward=False,
                                   compile=True)
    # Fits without checkpointing, but not with the 3 GB bf16 copy ZeRO-2 keeps: ZeRO-3.
    zero3 = estimate_bytes(Footprint(config, QWEN, 2, None), micro_batch=4, seq_len=2048,
                           grad_accum=1, reduce_dtype="fp32", checkpointing=False, zero2=False)
    assert plan(int(zero3 / HEADROOM) + 1) == base(False, True, True)
    assert plan(22 * GIB) == base(True, True, True)  # L4 budget: checkpoint, ZeRO-3
    assert plan(None, on_gpu=False) == base(False, True, False)  # CPU: eager, ZeRO-3
    explicit = dataclasses.replace(cfg, compile=False, reshard_after_forward=True,
                                   activation_checkpointing=True)
    assert plan(141 * GIB, explicit) == base(True, True, False)
    planned = plan(141 * GIB, dataclasses.replace(cfg, tokens_per_step=2 * 32 * 2048,
                                                  reduce_dtype="bf16"))
    assert (planned.micro_batch_size * planned.grad_accum, planned.reduce_dtype) == (32, "bf16")


def test_new_settings_are_validated_naming_the_flag():
    with pytest.raises(ConfigError) as e:
        TrainConfig(num_workers=8, seq_len=2048, tokens_per_step=3000, hsdp_replicas=3,
                    reduce_dtype="fp16", prefetch_layers=-1).validated()
    text = str(e.value)
    for flag in ("--tokens-per-step must be a positive multiple of --seq-len x --num-workers = "
                 "16384", "--hsdp-replicas must be at least 1 and divide --num-workers 8",
                 "--reduce-dtype", "--prefetch-layers"):
        assert flag in text
    assert len(e.value.problems) == 4
    TrainConfig(num_workers=8, seq_len=2048, tokens_per_step=8 * 2048 * 4,
                hsdp_replicas=2).validated()


def test_accumulation_dtype_is_validated_naming_the_flag():
    with pytest.raises(ConfigError, match="--accum-dtype must be one of"):
        TrainConfig(accum_dtype="fp16").validated()
    with pytest.raises(ConfigError, match="--accum-dtype bf16 needs --reduce-dtype bf16"):
        TrainConfig(accum_dtype="bf16").validated()  # FSDP2 accumulates in the reduce dtype
    TrainConfig(reduce_dtype="bf16", accum_dtype="fp32").validated()


def test_bus_bandwidth_factors_follow_nccl_tests():
    assert bus_factor("all_gather", 4) == 0.75 and bus_factor("all_reduce", 2) == 1.0


def test_link_report_names_bandwidths_and_exposed_share():
    line = link_report({"allgather_busbw_gbps": 11.5, "allreduce_busbw_gbps": None,
                        "exposed_comm_share": 0.62, "comm_share": 0.8})
    assert line == ("link: all-gather bus bandwidth 11.50 GB/s; exposed communication 62% of a "
                    "step (communication 80%)")
    assert "no collectives" in link_report({"allgather_busbw_gbps": None})


def test_an_explicit_activation_checkpointing_setting_binds_the_planner():
    tokens = 8 * 16 * 2048
    auto = _batch(plan_batch(*_l4(4, tokens_per_step=tokens, reduce_dtype="bf16"), world=8))
    cfg, fp = _l4(4, tokens_per_step=tokens, reduce_dtype="bf16", activation_checkpointing=True)
    with_ac = _batch(plan_batch(cfg, fp, world=8))
    assert with_ac[0] > auto[0]  # checkpointing frees memory for larger micro-batches
    assert fits(fp, cfg, micro_batch=with_ac[0], grad_accum=with_ac[1], checkpointing=True)
    cfg, fp = _l4(4, tokens_per_step=tokens, reduce_dtype="bf16", activation_checkpointing=False)
    micro, accum = _batch(plan_batch(cfg, fp, world=8))
    assert fits(fp, cfg, micro_batch=micro, grad_accum=accum)  # never a plan needing checkpoints


def test_a_plan_over_the_whole_gpu_even_at_the_frugal_end_is_refused_before_training():
    cfg, fp = _l4(8, micro_batch_size=64)  # 131,072 tokens of activations per L4
    with pytest.raises(ConfigError, match="micro-batch 64 at --seq-len 2048 needs about .* GiB "
                                          "per GPU even with activation checkpointing"):
        resolve_plan(cfg, fp, 8, "1x8", on_gpu=True)
    cfg, fp = _l4(8, micro_batch_size=2)
    assert resolve_plan(cfg, fp, 8, "1x8", on_gpu=True).micro_batch_size == 2  # fits: planned


def test_lora_plans_7b_on_two_l4_nodes_where_full_fine_tuning_cannot_fit():
    """The README's 7B recipe: 2 x g6.12xlarge, HSDP over the 4 L4s of a node, 16 sequences of
    2,048 per GPU and step. Full fine-tuning needs 16 bytes a parameter over 4 GPUs (30 GB) and
    is refused; LoRA's frozen bf16 base is 2, its adapters' fp32 state 16, and it fits."""
    from training.model.lora import LoraSpec, count_on_meta

    config = model_config("qwen2.5-7b")
    cfg = TrainConfig(model="qwen2.5-7b", seq_len=2048, num_workers=8, lora_rank=16,
                      lora_alpha=32, tokens_per_step=8 * 16 * 2048)
    num_params, trainable = count_on_meta(config, LoraSpec.from_config(cfg))
    assert 7.6e9 < num_params < 7.7e9 and 40e6 < trainable < 41e6  # 7.62B base, r=16 on all 7
    full = Footprint(config, num_params, 4, 22 * GIB, compiled=True, world=8)
    with pytest.raises(ConfigError, match="even with activation checkpointing"):
        plan_batch(dataclasses.replace(cfg, lora_rank=0), full, world=8)
    fp = dataclasses.replace(full, trainable_params=trainable)
    plan = resolve_plan(cfg, fp, 8, "2x4", on_gpu=True)  # the README's numbers
    micro, accum = plan.micro_batch_size, plan.grad_accum
    assert (micro, accum, plan.activation_checkpointing, plan.reshard_after_forward,
            plan.loss_chunk_tokens) == (8, 2, True, True, 2048)
    shape = dict(micro_batch=micro, seq_len=2048, grad_accum=accum, reduce_dtype="fp32",
                 checkpointing=True, zero2=False, loss_chunk_tokens=2048)
    assert 18.5 * GIB < estimate_bytes(fp, **shape) <= HEADROOM * 22 * GIB
    lora, dense = estimate_parts(fp, **shape), estimate_parts(full, **shape)
    # Sharded state: 16 bytes an adapter parameter, 2 a frozen one, over the 4 GPUs.
    frozen = num_params - trainable
    state = (16 * trainable + 2 * frozen) / 4
    assert lora.static - state < dense.static - 16 * num_params / 4  # no head gradient
    assert lora.static < 0.6 * 22 * GIB and lora.total <= HEADROOM * 22 * GIB


def test_frozen_head_and_lora_dropout_change_the_estimate_where_they_cost():
    from training.step.memory import activation_bytes, loss_bytes

    config = model_config("qwen2.5-7b")
    head = 2 * 4 * config.vocab_size * config.hidden_size  # two fp32 vocab x hidden buffers
    assert loss_bytes(config, 2048, 2048) - loss_bytes(config, 2048, 2048, False) == head
    plain = activation_bytes(config, 2048, checkpointing=False)
    dropped = activation_bytes(config, 2048, checkpointing=False, lora_dropout=True)
    # Each adapted layer's dropped input (bf16) and mask (bool), 28 layers.
    per_token_layer = 3 * (6 * config.hidden_size + config.intermediate_size)
    assert dropped - plain == 2048 * 28 * per_token_layer


def test_lora_settings_are_validated_with_the_flag_and_the_fix():
    bad = TrainConfig(lora_rank=-1, lora_alpha=0, lora_dropout=1.0,
                      lora_target_modules="q_proj, v proj", load_in_4bit=True).problems()
    assert any(p.startswith("--lora-rank must be 0 (full fine-tuning) or more") for p in bad)
    assert any(p.startswith("--lora-alpha must be positive") for p in bad)
    assert any(p.startswith("--lora-dropout must be at least 0 and below 1") for p in bad)
    assert any(p.startswith("--lora-target-modules must be comma-separated") for p in bad)
    assert any(p.startswith("--load-in-4bit: QLoRA") and "axolotl#2992" in p for p in bad)
    assert TrainConfig(lora_rank=8, lora_dropout=0.05).problems() == []

