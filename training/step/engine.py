"""The training step shared by the Ray train function and the benchmark: model, optimizer, step."""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor
from transformers import PretrainedConfig

from training.model import lora, loading
from training.config import TrainConfig
from training.errors import ConfigError
from training.data.packing import Batch
from training.model.loss import label_count
from training.step.metrics import model_flops_per_token
from training.model.model import CausalLMWithLoss, build_model, count_params, is_builtin
from training.step.memory import BatchPlan, Footprint, fits, plan_batch
from training.step.mesh import MeshLayout, build_mesh
from training.step.parallelize import shard_model
from training.step.schedule import Schedule


@dataclass(frozen=True)
class Plan:
    """The memory/speed/communication choices the defaults resolved to (reported with each run)."""
    activation_checkpointing: bool
    reshard_after_forward: bool
    compile: bool
    micro_batch_size: int
    grad_accum: int
    mesh: str  # replicas x shard group size: "1x8" is plain FSDP, "2x4" HSDP over two nodes
    reduce_dtype: str
    accum_dtype: str  # what the unsharded gradients accumulate in across micro-batches
    # the fused loss's chunk: --loss-chunk-tokens, or a smaller one for a larger LoRA
    # micro-batch (memory.loss_chunks)
    loss_chunk_tokens: int
    # LoRA: the frozen bf16 base whole on every GPU, outside FSDP2 (parallelize.shard_model)
    replicate_base: bool = False

    @property
    def replicas(self) -> int:
        """The mesh's replica count (HSDP groups; 1 is plain FSDP)."""
        return int(self.mesh.split("x")[0])

    @property
    def batch(self) -> BatchPlan:
        """The batch part of the plan (memory.plan_batch's), what the loop and evaluation read."""
        return BatchPlan(self.micro_batch_size, self.grad_accum)


@dataclass(frozen=True)
class Load:
    """Pretrained weights: read on rank 0, broadcast and sharded (model/loading.load_sharded)."""
    load_s: float
    load_host_rss_gib: list[float]  # peak host RSS per rank after it

    @classmethod
    def of(cls, measured: dict) -> "Load":
        """From load_sharded's measurement (its keys are these fields)."""
        return cls(measured["load_s"], measured["load_host_rss_gib"])


@dataclass
class Engine:
    model: CausalLMWithLoss
    optimizer: torch.optim.Optimizer
    device: torch.device
    num_params: int
    flops_per_token: float
    plan: Plan
    mesh: DeviceMesh | None = None
    grad_norm: torch.Tensor | None = None  # of the last train_step
    load: Load | None = None  # pretrained weights: seconds, host RSS per rank
    lora: lora.LoraSpec | None = None  # None: full fine-tuning
    trainable_params: int = 0  # what gets gradients and Adam state (LoRA: the adapters)
    # --objective dpo: model/dpo.DpoObjective (count and loss of a micro-batch); None: SFT's
    objective: object | None = None


def build_engine(cfg: TrainConfig, model_cfg: PretrainedConfig, device: torch.device,
                 policy: MixedPrecisionPolicy | None = None, *, plan: Plan | None = None,
                 spec: lora.LoraSpec | None = None) -> Engine:
    """Build, shard and wrap the model and its AdamW (fused on GPU) for the default process
    group; `policy` overrides the device's mixed precision (bf16 on CPU, for tests). A job's
    worker passes the driver's `plan` and LoRA `spec` (driver/plan.py), used as given: the mesh
    is the plan's. Without a plan (the benchmark, tests) the engine plans for itself, the same
    way (`plan_step`), on its own mesh and device, with the adapters of `cfg`."""
    started = time.perf_counter()
    if plan is None:
        spec = lora.LoraSpec.from_config(cfg)
    # A frozen LoRA base needs no fp32 master copy: bf16 wherever compute is bf16.
    base_dtype = torch.bfloat16 if spec and (device.type == "cuda" or policy) else torch.float32
    lm = build_model(cfg.model, model_cfg, seed=cfg.seed, device=device,  # meta if pretrained
                     attention=cfg.attention, dtype=base_dtype)
    prepare = spec and functools.partial(lora.apply, spec=spec, base_dtype=base_dtype,
                                         seed=cfg.seed)
    if prepare:
        prepare(lm)
    num_params = count_params(lm)
    trainable = sum(p.numel() for p in lm.parameters() if p.requires_grad)
    mesh, layout = build_mesh(plan.replicas if plan else cfg.hsdp_replicas, device)
    limit = memory_limit_bytes(cfg, device)  # also enforces --memory-budget-gib
    if plan is None:
        plan = plan_step(cfg, model_cfg, (num_params, trainable), spec, layout, limit,
                         on_gpu=device.type == "cuda")
    model = CausalLMWithLoss(lm, plan.loss_chunk_tokens, compile_loss=plan.compile)
    shard_model(model, device, mesh=mesh, reshard_after_forward=plan.reshard_after_forward,
                activation_checkpointing=plan.activation_checkpointing, compile_layers=plan.compile,
                reduce_dtype=plan.reduce_dtype, accum_dtype=plan.accum_dtype,
                prefetch_layers=cfg.prefetch_layers, policy=policy,
                replicate_frozen=plan.replicate_base)
    load = None if is_builtin(cfg.model) else Load.of(loading.load_sharded(
        model, loading.rank0_state(cfg.model, model_cfg, dist.get_rank(), base_dtype, prepare),
        device, started))
    optimizer = _adamw(cfg, [p for p in model.parameters() if p.requires_grad], device)
    fpt = model_flops_per_token(model_cfg, num_params, cfg.seq_len, trainable)
    return Engine(model, optimizer, device, num_params, fpt, plan, mesh, load=load, lora=spec,
                  trainable_params=trainable)


def plan_step(cfg: TrainConfig, model_cfg: PretrainedConfig, counts: tuple[int, int],
              spec: lora.LoraSpec | None, layout: MeshLayout, limit: int | None, *,
              on_gpu: bool, headroom: float = 1.0, note: str = "") -> Plan:
    """The step's plan (`resolve_plan`) for a model of `counts` (all parameters, trainable ones)
    sharded as `layout` says, within `limit` bytes a GPU (None: CPU, no limit). One function for
    the job's driver, which plans before any worker starts, and a standalone engine."""
    num_params, trainable = counts
    compiled = on_gpu if cfg.compile is None else cfg.compile
    world = layout.replicas * layout.shard_size
    fp = Footprint(model_cfg, num_params, layout.shard_size, limit, compiled, world,
                   trainable if spec else None, bool(spec and spec.dropout))
    # One GPU: a frozen base replicated when it fits (no gathered copies, no copy-in/out per
    # layer and micro-batch). Over several, sharding it trades all-gathers for a larger
    # micro-batch, and the base stays sharded: the step model (training/step/step_time.py)
    # needs the shard group's link and the GPU's compute rate, and the planner knows neither
    # before the warm-up probe (stack/catalog.py holds an EFA floor, no rate between a node's
    # GPUs; the driver asks a GPU its memory only). At the nominal inputs the 7B recipe on
    # 2 x g6.12xlarge would replicate for 0.6% (python -m bench.step_model --preset
    # g6.12xlarge-x2, bench/MODEL.md): inside the model's error, and the replicated plan's 4x
    # more micro-batches each carry launch overhead the model does not count.
    if spec and layout.shard_size == 1:
        try:
            return resolve_plan(cfg, dataclasses.replace(fp, replicated_base=True), world,
                                layout.shape, on_gpu=on_gpu, headroom=headroom, note=note)
        except ConfigError:
            pass
    return resolve_plan(cfg, fp, world, layout.shape, on_gpu=on_gpu, headroom=headroom, note=note)


def _adamw(cfg: TrainConfig, params: list, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only (fused on GPU), no decay on vectors."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def resolve_plan(cfg: TrainConfig, fp: Footprint, world: int, mesh: str, *, on_gpu: bool,
                 headroom: float = 1.0, note: str = "") -> Plan:
    """Resolve the defaults: micro-batch and accumulation from --tokens-per-step (memory.plan_batch);
    checkpoint activations only when memory needs it; keep the gathered weights between forward
    and backward (ZeRO-2, fewer all-gathers, and across micro-batches) only when their bf16 copy
    fits without checkpointing; compile on GPU, where eager Hugging Face layers under FSDP2 are
    CPU-bound (bench/NOTES.md), not on CPU, where compiling costs more than a laptop run gains.
    Explicit settings always win. Refused (memory.plan_batch, `note` appended) when even the
    frugal end exceeds `headroom` of the limit: by default the whole limit, a certain OOM."""
    batch = plan_batch(cfg, fp, world, headroom=headroom, note=note)
    micro, accum = batch.micro_batch_size, batch.grad_accum
    chunk = cfg.loss_chunk_tokens if batch.loss_chunk_tokens is None else batch.loss_chunk_tokens
    shape = {"micro_batch": micro, "grad_accum": accum, "loss_chunk_tokens": chunk}
    checkpointing = cfg.activation_checkpointing
    if checkpointing is None:
        checkpointing = not fits(fp, cfg, **shape)
    reshard = cfg.reshard_after_forward
    if reshard is None:
        reshard = checkpointing or fp.limit_bytes is None or not fits(fp, cfg, **shape, zero2=True)
    return Plan(checkpointing, reshard, on_gpu if cfg.compile is None else cfg.compile,
                micro, accum, mesh, cfg.reduce_dtype, cfg.accum_dtype or cfg.reduce_dtype,
                chunk, fp.replicated_base)


def memory_limit_bytes(cfg: TrainConfig, device: torch.device) -> int | None:
    """Usable GPU memory: the device's, or --memory-budget-gib, which is also enforced here."""
    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    if cfg.memory_budget_gib is None:
        return total
    budget = min(int(cfg.memory_budget_gib * 2**30), total)  # a budget over the GPU is the GPU
    torch.cuda.set_per_process_memory_fraction(budget / total, device)
    return budget


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (1-based) of a fresh run (training/step/schedule.py)."""
    return Schedule.from_config(cfg).lr(step)


def train_step(engine: Engine, micro_batches: list[Batch | tuple], lr: float,
               grad_clip: float) -> torch.Tensor:
    """One optimizer step over the micro-batches (Batch, or (inputs, labels) pairs).

    The loss is a token mean over the whole step: the summed loss of every labelled token of
    every micro-batch on every rank, divided by their count (one all-reduce of the count per
    step), as torchtitan's trainer does and Hugging Face's "Fixing gradient accumulation"
    (2024-10-16) explains; a mean of per-micro-batch means over-weights short completions.
    FSDP's own division by the world size is off (parallelize.py), so the gradients, their norm
    and the clipping are of that mean. Returns this rank's share of the loss times the world
    size (a device tensor, no sync): its mean across ranks is the step's loss."""
    model, opt, device = engine.model, engine.optimizer, engine.device
    for group in opt.param_groups:
        group["lr"] = lr
    batches = [(b if hasattr(b, "to") else Batch(*b)).to(device) for b in micro_batches]
    objective = engine.objective
    count = sum(objective.count(b) if objective else label_count(b.labels)
                for b in batches).float()
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        dist.all_reduce(count)
    total = torch.zeros((), device=device)
    keep_gathered = not engine.plan.reshard_after_forward
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        # Communicate once per optimizer step: no reduce-scatter/all-reduce before the last
        # micro-batch, and under ZeRO-2 (memory allows the gathered weights) no re-gathering
        # either: FSDP2's set_reshard_after_backward exists for exactly this trade.
        model.set_requires_gradient_sync(last)
        if keep_gathered:
            model.set_reshard_after_backward(last)
        loss = objective.loss(model, batch, count) if objective else \
            model(batch.inputs, batch.labels, batch.positions, normalizer=count)
        loss.backward()
        total += loss.detach()
    engine.grad_norm = _grad_norm_and_clip(model, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return total * world


def _grad_norm_and_clip(model: torch.nn.Module, grad_clip: float) -> torch.Tensor:
    """The global gradient norm (a device tensor, no sync; the loop's non-finite guard reads it),
    clipping to `grad_clip` when set. Sharded DTensor norms are reduced with `full_tensor`, as
    torchtitan's `clip_grad_norm_` does for FSDP2 (torchtitan/distributed/utils.py)."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if grad_clip:
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, norm)
    return norm


def mean_across_ranks(value: torch.Tensor) -> float:
    v = value.detach().clone().float()
    if dist.is_initialized():
        dist.all_reduce(v)
        v /= dist.get_world_size()
    return float(v)
