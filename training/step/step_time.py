"""The step-time model: a training step's time on a topology, from its compute and its links.

For a plan (mesh replicas x shard, reduce dtype, ZeRO-2/3, micro-batch, accumulation) and links
(bus bandwidth of the shard group's and of the replicate group's collectives, as the job's warm-up
probe measures them) it gives the compute time, the bytes each rank moves on each link, the exposed
communication and tokens/s per GPU. `python -m bench.step_model` checks it against the benchmark's
rows (bench/MODEL.md, where the overlap rule is stated); the job uses it to say what a link below
its floor costs (training/network/link_floor.py). Here and not in bench/ because the job needs it
and bench/ is not shipped with the job. Standard library only.

The overlap rule: FSDP issues one collective per layer group and computes layer by layer, so
compute c and communication m of a phase run as a two-stage pipeline of L layers:
max(c, m) + min(c, m) / L. Not modelled: optimizer step, kernel launch gaps, NCCL latency.

LoRA (`StepPlan.trainable`): only the adapters get gradients, so only they are reduced; the frozen
bf16 base is gathered like any weight when FSDP2 shards it, and never when every GPU holds it
whole (`replicated_base`, parallelize.shard_model), where only the adapters are gathered. Its
backward computes weight gradients for the adapters only: about one forward's FLOPs instead of
two (`forwards`).
"""

from __future__ import annotations

from dataclasses import dataclass

REDUCE_BYTES = {"fp32": 4, "bf16": 2}
PARAM_BYTES = 2  # gathered weights are bf16 in ours (compute dtype) and in the reference


@dataclass(frozen=True)
class StepPlan:
    params: int
    layers: int
    replicas: int
    shard: int
    reduce_dtype: str
    zero2: bool
    micro_batch: int
    grad_accum: int
    seq_len: int
    checkpointing: bool = False
    reduce_every_micro_batch: bool = False  # the reference's plain accumulation under FSDP1
    trainable: int | None = None  # LoRA: the adapters' parameters; None: all `params` trained
    replicated_base: bool = False  # LoRA: the frozen base whole on every GPU, never gathered

    @property
    def reduced(self) -> int:
        """Parameters whose gradients are reduced: the trained ones."""
        return self.params if self.trainable is None else self.trainable

    @property
    def gathered(self) -> int:
        """Parameters FSDP2 all-gathers: all but a replicated frozen base."""
        return self.reduced if self.replicated_base else self.params


@dataclass(frozen=True)
class Links:
    shard_gbps: float | None  # bus bandwidth of the shard group's all-gather / reduce-scatter
    replicate_gbps: float | None  # bus bandwidth of the replicas' all-reduce
    separate: bool  # shard and replicate groups on different links (HSDP across nodes)


@dataclass(frozen=True)
class Prediction:
    compute_s: float
    step_s: float
    exposed_comm_s: float
    shard_link_gb_per_rank: float
    replicate_link_gb_per_rank: float
    tokens_per_s_per_gpu: float


def _pipe(compute: float, comm: float, layers: int) -> float:
    return max(compute, comm) + min(compute, comm) / layers


def _seconds(gb: float, gbps: float | None) -> float:
    if not gb:
        return 0.0
    if not gbps:
        raise ValueError("a collective moves bytes over a link whose bandwidth is unknown")
    return gb / gbps


def forwards(plan: StepPlan) -> float:
    """A micro-batch's weight FLOPs in forward passes (2 a parameter and token each): the
    forward, the input gradients (one more) and the weight gradients of the trained share (one
    more for full fine-tuning, almost none for LoRA's adapters), and checkpointing's recompute."""
    return 2 + plan.reduced / plan.params + plan.checkpointing


def compute_s(plan: StepPlan, flops_per_token: float, flops_per_s: float) -> float:
    """One micro-batch's compute at `flops_per_s`: `flops_per_token` counts the step without
    recompute (metrics.flops_per_token, less 2 a frozen parameter: engine.build_engine), so
    checkpointing adds one forward's share of it."""
    passes = forwards(plan)
    seconds = plan.micro_batch * plan.seq_len * flops_per_token / flops_per_s
    return seconds * passes / (passes - plan.checkpointing)


def predict(plan: StepPlan, compute_s_per_micro_batch: float, links: Links) -> Prediction:
    """Step time of `plan` given the measured (or derived) compute per micro-batch and links."""
    s, r, reduce_bytes = plan.shard, plan.replicas, REDUCE_BYTES[plan.reduce_dtype]
    gather_gb = PARAM_BYTES * plan.gathered * (s - 1) / s / 1e9
    rs_gb = reduce_bytes * plan.reduced * (s - 1) / s / 1e9
    ar_gb = reduce_bytes * plan.reduced / s * 2 * (r - 1) / r / 1e9
    t_gather = _seconds(gather_gb, links.shard_gbps)
    t_rs, t_ar = _seconds(rs_gb, links.shard_gbps), _seconds(ar_gb, links.replicate_gbps)
    c = compute_s_per_micro_batch
    forward = c / forwards(plan)
    backward = c - forward
    step, gathers, reduces = 0.0, 0, 0
    for i in range(plan.grad_accum):
        gather_fwd = i == 0 or not plan.zero2
        gather_bwd = not plan.zero2
        reduce = plan.reduce_every_micro_batch or i == plan.grad_accum - 1
        gathers += gather_fwd + gather_bwd
        reduces += reduce
        shard_link = t_gather * gather_bwd + t_rs * reduce
        bwd_comm = (max(shard_link, t_ar * reduce) if links.separate
                    else shard_link + t_ar * reduce)
        step += _pipe(forward, t_gather * gather_fwd, plan.layers)
        step += _pipe(backward, bwd_comm, plan.layers)
    compute = c * plan.grad_accum
    return Prediction(compute, step, step - compute, gathers * gather_gb + reduces * rs_gb,
                      reduces * ar_gb, plan.micro_batch * plan.grad_accum * plan.seq_len / step)
