"""Per-GPU memory estimate and the batch planner built on it.

The estimate (bytes, per GPU): sharded fp32 state (weights, gradients, two Adam moments: 16 bytes
per parameter over the shard group), saved activations of one micro-batch, and extras:
  - gradient accumulation without communication keeps unsharded gradients of the whole model in
    the reduce dtype until the last micro-batch (FSDP2 `FSDPParam.to_accumulated_grad_if_needed`
    upcasts them to `reduce_dtype`: 4 bytes/param for fp32, 2 for bf16);
  - ZeRO-2 keeps the whole gathered bf16 model (2 bytes/param) between forward and backward.
It must fit in 90% of the GPU (or --memory-budget-gib).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from training.config import TrainConfig

HEADROOM = 0.9
REDUCE_BYTES = {"fp32": 4, "bf16": 2}


@dataclass(frozen=True)
class Footprint:
    """What the estimate needs to know about the run besides the settings."""
    model_cfg: PretrainedConfig
    num_params: int
    shard_size: int
    limit_bytes: int | None  # None: CPU, no limit


# Bytes of saved activations per token per decoder layer, without checkpointing, in bf16:
# ~24 hidden-sized and ~4 intermediate-sized tensors. Calibrated against the 33 GiB of activations
# measured for Qwen2.5-1.5B at 8,192 tokens per GPU (design notes' FSDP2 table).
def _activation_bytes_per_token_layer(model_cfg: PretrainedConfig) -> int:
    return 2 * (24 * model_cfg.hidden_size + 4 * model_cfg.intermediate_size)


def activation_bytes(model_cfg: PretrainedConfig, tokens: int, checkpointing: bool) -> int:
    """Saved activations of one micro-batch; checkpointing keeps each layer's bf16 input plus one
    layer's activations while it is recomputed."""
    per_layer = _activation_bytes_per_token_layer(model_cfg)
    if checkpointing:
        return tokens * (model_cfg.num_hidden_layers * 2 * model_cfg.hidden_size + per_layer)
    return tokens * model_cfg.num_hidden_layers * per_layer


def estimate_bytes(fp: Footprint, *, micro_batch: int, seq_len: int, grad_accum: int,
                   reduce_dtype: str, checkpointing: bool, zero2: bool) -> int:
    state = 16 * fp.num_params / fp.shard_size
    accumulated = REDUCE_BYTES[reduce_dtype] * fp.num_params if grad_accum > 1 else 0
    gathered = 2 * fp.num_params if zero2 else 0
    return int(state + activation_bytes(fp.model_cfg, micro_batch * seq_len, checkpointing)
               + accumulated + gathered)


def fits(fp: Footprint, cfg: TrainConfig, *, micro_batch: int, grad_accum: int,
         checkpointing: bool = False, zero2: bool = False) -> bool:
    """True on CPU (no limit) or when the estimate is within 90% of the limit."""
    if fp.limit_bytes is None:
        return True
    need = estimate_bytes(fp, micro_batch=micro_batch, seq_len=cfg.seq_len, grad_accum=grad_accum,
                          reduce_dtype=cfg.reduce_dtype, checkpointing=checkpointing, zero2=zero2)
    return need <= HEADROOM * fp.limit_bytes


def cannot_fit(fp: Footprint, cfg: TrainConfig, *, micro_batch: int, grad_accum: int,
               headroom: float = HEADROOM) -> str | None:
    """Why this plan cannot fit even with activation checkpointing and ZeRO-3 (the frugal end of
    every lever), or None when it can (or there is no limit)."""
    if fp.limit_bytes is None:
        return None
    need = estimate_bytes(fp, micro_batch=micro_batch, seq_len=cfg.seq_len, grad_accum=grad_accum,
                          reduce_dtype=cfg.reduce_dtype, checkpointing=True, zero2=False)
    if need <= headroom * fp.limit_bytes:
        return None
    fix = ("--seq-len, or add workers" if cfg.tokens_per_step else
           "--micro-batch-size (raise --grad-accum to keep the batch) or --seq-len, or add workers")
    return (f"micro-batch {micro_batch} at --seq-len {cfg.seq_len} needs about "
            f"{need / headroom / 2**30:.1f} GiB per GPU even with activation checkpointing, over "
            f"the {fp.limit_bytes / 2**30:.1f} GiB available; lower {fix}")


def plan_batch(cfg: TrainConfig, fp: Footprint, world: int) -> tuple[int, int]:
    """(micro-batch, accumulation) for --tokens-per-step, or the flags' own when it is not set.

    The largest micro-batch that divides the worker's sequences per step and fits without
    activation checkpointing wins (fewer, larger micro-batches: larger GEMMs, fewer launches; the
    communication happens once per step either way); if none does, the largest that fits with
    checkpointing; micro-batch 1 if nothing fits (the run then reports its memory).
    """
    if cfg.tokens_per_step is None:
        return cfg.micro_batch_size, cfg.grad_accum
    sequences = max(1, cfg.tokens_per_step // (cfg.seq_len * world))
    sizes = [m for m in range(sequences, 0, -1) if sequences % m == 0]
    explicit = cfg.activation_checkpointing
    for checkpointing in (False, True) if explicit is None else (explicit,):
        for m in sizes:
            if fits(fp, cfg, micro_batch=m, grad_accum=sequences // m, checkpointing=checkpointing):
                return m, sequences // m
    return 1, sequences
