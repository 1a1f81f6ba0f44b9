"""fp32 gradient accumulation under a bf16 reduce (`--accum-dtype fp32 --reduce-dtype bf16`):
real FSDP2 with bf16 parameters on two gloo ranks (tests/training/inproc.py), 16 micro-batches."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.training.inproc import run_ranks
from training.model.model import CausalLMWithLoss, build_model, model_config
from training.step.parallelize import precision_policy, shard_model

MICRO, SEQ = 16, 16


def _step_grads(reduce_dtype: str, accum_dtype: str | None) -> list[torch.Tensor]:
    """This rank's fp32 gradient shards after one step of MICRO micro-batches, synced once."""
    torch.manual_seed(0)
    config = model_config("tiny")
    model = CausalLMWithLoss(build_model("tiny", config, seed=0, device=torch.device("cpu")), 64)
    shard_model(model, torch.device("cpu"), reshard_after_forward=True,
                activation_checkpointing=False, reduce_dtype=reduce_dtype,
                accum_dtype=accum_dtype, policy=precision_policy(reduce_dtype, accum_dtype))
    g = torch.Generator().manual_seed(100 + dist.get_rank())
    for i in range(MICRO):
        tokens = torch.randint(0, config.vocab_size, (2, SEQ + 1), generator=g)
        model.set_requires_gradient_sync(i == MICRO - 1)
        (model(tokens[:, :-1], tokens[:, 1:]) / MICRO).backward()
    return [p.grad.to_local().clone() for p in model.parameters()]


def _rel_error(grads: list[torch.Tensor], truth: list[torch.Tensor]) -> float:
    diff = sum(float((a.double() - b.double()).square().sum()) for a, b in zip(grads, truth))
    return (diff / sum(float(b.double().square().sum()) for b in truth)) ** 0.5


def _variants() -> dict[str, list[torch.Tensor]]:
    return {"fp32": _step_grads("fp32", None), "bf16": _step_grads("bf16", None),
            "fp32-accum": _step_grads("bf16", "fp32")}


def test_fp32_accumulation_reduces_in_bf16_once_and_beats_bf16_accumulation():
    ranks = run_ranks(2, _variants)
    for got in ranks:
        truth = got["fp32"]  # fp32 accumulation and fp32 reduce: the reference
        # The wire was bf16: every reduced value is a bf16 number (cast back to fp32 shards) ...
        assert all(torch.equal(g, g.bfloat16().float()) for g in got["fp32-accum"])
        assert not all(torch.equal(g, g.bfloat16().float()) for g in truth)
        # ... and accumulating 16 micro-batches in fp32 is closer to the reference than in bf16.
        fp32_accum, bf16 = _rel_error(got["fp32-accum"], truth), _rel_error(got["bf16"], truth)
        assert fp32_accum < bf16 / 2, (fp32_accum, bf16)
