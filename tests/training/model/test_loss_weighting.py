"""The loss is a token mean over the whole optimizer step: uneven label masks across micro-batches
and ranks give the gradients of one process on the whole batch (real FSDP2 on gloo ranks)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tests.training.inproc import run_ranks
from training.config import TrainConfig
from training.step.engine import build_engine, mean_across_ranks, train_step
from training.model.loss import IGNORE_INDEX
from training.model.model import CausalLMWithLoss, build_model, model_config

SEQ = 16
LABELLED = (16, 2, 5, 12)  # labelled tokens of each row of the global batch: very uneven
CFG = TrainConfig(model="tiny", seq_len=SEQ, lr=1e-2, warmup_steps=0, grad_clip=0.0, seed=0)


def _global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 512, (len(LABELLED), SEQ + 1), generator=g)
    labels = tokens[:, 1:].clone()
    for row, n in enumerate(LABELLED):
        labels[row, :SEQ - n] = IGNORE_INDEX  # a prompt of SEQ - n tokens, then the completion
    return tokens[:, :-1], labels


def _step(accum: int) -> dict:
    """One optimizer step over this rank's rows, in `accum` micro-batches of one row each."""
    rank, world = dist.get_rank(), dist.get_world_size()
    engine = build_engine(CFG, model_config("tiny"), torch.device("cpu"))
    rows = len(LABELLED) // world
    mine = [t[rank * rows:(rank + 1) * rows] for t in _global_batch()]
    micro = [tuple(t.chunk(accum)[i] for t in mine) for i in range(accum)]
    grads = {}

    def snapshot(*_):  # the reduced gradients the optimizer is about to apply (collective)
        for name, p in engine.model.named_parameters():
            grads[name] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad.clone()

    engine.optimizer.register_step_pre_hook(snapshot)
    loss = mean_across_ranks(train_step(engine, micro, CFG.lr, CFG.grad_clip))
    return {"loss": loss, "grad_norm": float(engine.grad_norm), "grads": grads,
            "one": _one_process()}


def _one_process() -> dict:
    """The same model unsharded in this process, on the whole batch in one forward: the mean
    over every labelled token, by definition."""
    model = CausalLMWithLoss(build_model("tiny", model_config("tiny"), seed=CFG.seed),
                             CFG.loss_chunk_tokens)
    loss = model(*_global_batch())
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
    return {"loss": float(loss), "grad_norm": float(norm), "grads": grads}


def test_uneven_masks_over_micro_batches_and_two_ranks_equal_one_process_on_the_batch():
    two = run_ranks(2, _step, 2)[0]  # each rank: 2 micro-batches of 1 row
    one = two["one"]
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    bad = [k for k in one["grads"] if not torch.allclose(one["grads"][k], two["grads"][k],
                                                         rtol=1e-4, atol=1e-7)]
    assert not bad, bad
