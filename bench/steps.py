"""The steps the benchmark compares, each a function of one optimizer step's micro-batches: the
reference approach (the AWS sample's FSDP1 setup) and ours (the job's engine); plus the
packed-documents form of a batch and the compute-only timing the step-time model needs."""

from __future__ import annotations

import contextlib
import functools
import statistics
from typing import TYPE_CHECKING, Callable

import torch

from bench.timing import back_to_back_seconds
from training.config import TrainConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from training.step.engine import Engine

# One optimizer step over its list of micro-batches (each a tuple of tensors).
Step = Callable[[list], None]


def reference_step(model_cfg: PretrainedConfig, device: torch.device,
                   no_sync: bool = False) -> tuple[Step, tuple]:
    """The AWS sample's setup: FSDP1 size-based wrap (1e7), bf16 model, plain AdamW, HF loss;
    `no_sync` accumulates all but the last micro-batch inside FSDP1's `no_sync()` (unsharded
    gradients kept, one reduce-scatter per optimizer step: torch/distributed/fsdp/
    fully_sharded_data_parallel.py `no_sync`)."""
    import ray.train.torch
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_cfg, attn_implementation="sdpa",
                                                 dtype=torch.bfloat16)
    model = ray.train.torch.prepare_model(model, parallel_strategy="fsdp", parallel_strategy_kwargs={
        "auto_wrap_policy": functools.partial(size_based_auto_wrap_policy, min_num_params=int(1e7))})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    # At world size 1 prepare_model returns the model unwrapped (ray/train/torch/
    # train_loop_utils.py: it wraps only `if parallel_strategy and world_size > 1`), so there is
    # no no_sync() and nothing to communicate: both references then run the same step.
    no_sync = no_sync and hasattr(model, "no_sync")

    def step(micro):
        for i, (inputs, labels) in enumerate(micro):  # without no_sync: reduce every micro-batch
            quiet = no_sync and i < len(micro) - 1
            with model.no_sync() if quiet else contextlib.nullcontext():
                (model(input_ids=inputs, labels=inputs).loss / len(micro)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, (model, opt)


def with_documents(batches: list, documents: int, seq_len: int) -> list:
    """The same tokens as packed rows of `documents` equal documents: per-document positions,
    and no label across a boundary (as training/data/packing.py makes them)."""
    from training.model.loss import IGNORE_INDEX

    length = seq_len // documents
    positions = (torch.arange(seq_len) % length).expand(1, -1)
    out = []
    for micro in batches:
        step = []
        for inputs, labels in micro:
            labels = labels.masked_fill((positions == length - 1).to(labels.device), IGNORE_INDEX)
            step.append((inputs, labels, positions.to(inputs.device).expand_as(inputs)))
        out.append(step)
    return out


def ours_step(cfg: TrainConfig, model_cfg: PretrainedConfig,
              device: torch.device) -> tuple[Step, Engine]:
    """The job's real step: `engine.build_engine` + `engine.train_step` at a fixed learning rate."""
    from training.step.engine import build_engine, lr_at, train_step

    engine = build_engine(cfg, model_cfg, device)

    def step(micro):
        step.losses.append(train_step(engine, micro, lr_at(10, cfg), cfg.grad_clip).detach())
    step.losses = []  # this rank's share of each step's loss (device tensors: no sync)
    return step, engine


@contextlib.contextmanager
def liger_kernels(on: bool):
    """With `on`, Liger-Kernel's RMSNorm, SwiGLU MLP and rotary embedding replace transformers'
    Qwen2 ones for the block (`apply_liger_kernel_to_qwen2` swaps the module's names:
    liger_kernel/transformers/monkey_patch.py, 0.8.5), its own loss off (the fused loss is
    ours); the names are put back afterwards, so later variants build the stock model. The
    rotary function is looked up at every forward, so the block must hold the whole run."""
    if not on:
        yield
        return
    from liger_kernel.transformers import apply_liger_kernel_to_qwen2
    from transformers.models.qwen2 import modeling_qwen2

    names = ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP")
    stock = {n: getattr(modeling_qwen2, n) for n in names}
    apply_liger_kernel_to_qwen2(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                fused_linear_cross_entropy=False)
    try:
        yield
    finally:
        for n, v in stock.items():
            setattr(modeling_qwen2, n, v)


def compute_only_seconds(engine: Engine, micro: list, device: torch.device) -> float:
    """Seconds per micro-batch of forward + backward with no communication: gradients stay
    unsharded and unreduced (no sync), and the weights, gathered once, stay gathered. The
    step-time model's compute input. Leaves the engine unusable for training (call it last)."""
    model = engine.model
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_forward(False)
    model.set_reshard_after_backward(False)

    def fwd_bwd(batch):
        model(*batch).backward()

    fwd_bwd(micro[0])  # gathers every group once
    times = back_to_back_seconds([lambda b=b: fwd_bwd(b) for b in micro * 2], device)
    return statistics.median(times)


def probe_reference(device: torch.device) -> dict:
    """The reference shards over all workers: probe the world group as one shard group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from training.network.bandwidth import probe

    return probe(init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("shard",)),
                 device)
