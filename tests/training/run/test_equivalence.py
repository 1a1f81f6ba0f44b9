"""The training step and checkpoints, compared with what they must equal: a resumed run with an
uninterrupted one (weights, Adam state, next losses), two FSDP2 ranks with one process, gradient
accumulation with one large batch. Real FSDP2 and DCP on gloo ranks (tests/training/inproc.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict)

from tests.training.inproc import run_ranks
from training.run import checkpoint
from training.config import TrainConfig
from training.step.engine import Engine, build_engine, mean_across_ranks, train_step
from training.model.model import model_config

STEPS, GLOBAL_BATCH, SEQ = 6, 4, 16
# A small clip keeps clipping active on every step, so the sharded gradient norm is exercised.
CFG = TrainConfig(model="tiny", seq_len=SEQ, lr=1e-2, warmup_steps=0, grad_clip=0.05, seed=0)


def _global_batches() -> torch.Tensor:
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, 512, (STEPS, GLOBAL_BATCH, SEQ + 1), generator=g)


def _engine(seed: int = 0) -> Engine:
    cfg = dataclasses.replace(CFG, seed=seed)
    return build_engine(cfg, model_config("tiny"), torch.device("cpu"))


def _train(engine: Engine, steps: range, accum: int) -> list[tuple[float, float]]:
    """Optimizer steps over this rank's rows of each global batch, in `accum` micro-batches;
    (loss, gradient norm before clipping) of each."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = GLOBAL_BATCH // world
    losses = []
    for step in steps:
        mine = _global_batches()[step, rank * rows:(rank + 1) * rows]
        micro = [(m[:, :-1], m[:, 1:]) for m in mine.chunk(accum)]
        loss = mean_across_ranks(train_step(engine, micro, CFG.lr, CFG.grad_clip))
        losses.append((loss, float(engine.grad_norm)))
    return losses


def _full_state(engine: Engine) -> dict:
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {"model": get_model_state_dict(engine.model, options=opts),
            "optim": get_optimizer_state_dict(engine.model, engine.optimizer,
                                              options=opts).get("state", {})}


def _one_process() -> dict:
    big = _engine()
    big_losses = _train(big, range(STEPS), accum=1)
    accumulated = _engine()
    acc_losses = _train(accumulated, range(STEPS), accum=2)
    return {"big": (big_losses, _full_state(big)), "accum": (acc_losses, _full_state(accumulated))}


def _two_ranks(ckpt_dir: str) -> dict:
    straight = _engine()
    losses = _train(straight, range(STEPS), accum=1)
    first = _engine()
    half = STEPS // 2
    before = _train(first, range(half), accum=1)
    checkpoint.save_local(first, checkpoint.RunState(step=half, samples_seen=7), ckpt_dir)
    resumed = _engine(seed=99)  # other initial weights: only the checkpoint can make them equal
    state = checkpoint.load_local(resumed, ckpt_dir)
    lm = resumed.model.lm
    after = _train(resumed, range(half, STEPS), accum=1)
    return {"straight": (losses, _full_state(straight)), "resumed": (before + after,
                                                                     _full_state(resumed)),
            "state": state, "tied": lm.lm_head.weight is lm.model.embed_tokens.weight}


@pytest.fixture(scope="module")
def one_process():
    return run_ranks(1, _one_process)[0]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("ckpt")
    return run_ranks(2, _two_ranks, str(ckpt))[0], ckpt


def _assert_states(a: dict, b: dict, exact: bool) -> None:
    assert a["model"].keys() == b["model"].keys() and a["optim"].keys() == b["optim"].keys()
    bad = []
    for k in a["model"]:
        if not _same(a["model"][k], b["model"][k], exact):
            bad.append((k, float((a["model"][k] - b["model"][k]).abs().max())))
    for k in a["optim"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            if not _same(a["optim"][k][name], b["optim"][k][name], exact):
                diff = (a["optim"][k][name] - b["optim"][k][name]).abs().max()
                bad.append((k, name, float(diff)))
    assert not bad, bad


def _same(x: torch.Tensor, y: torch.Tensor, exact: bool) -> bool:
    return torch.equal(x, y) if exact else torch.allclose(x, y, rtol=1e-3, atol=5e-5)


def test_resume_equals_an_uninterrupted_run_in_weights_adam_state_and_next_losses(two_ranks):
    result, _ = two_ranks
    (straight_losses, straight), (resumed_losses, resumed) = result["straight"], result["resumed"]
    assert resumed_losses == straight_losses
    _assert_states(straight, resumed, exact=True)
    assert result["state"] == checkpoint.RunState(step=STEPS // 2, samples_seen=7)


def test_tied_embedding_is_stored_once_and_stays_tied_after_loading(two_ranks):
    result, ckpt = two_ranks
    keys = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    assert "model.lm.model.embed_tokens.weight" in keys
    assert not any(k.startswith("model.lm.lm_head") for k in keys)
    assert result["tied"]


def test_two_fsdp2_ranks_equal_one_process_with_clipping(one_process, two_ranks):
    (one_losses, one), (two_losses, two) = one_process["big"], two_ranks[0]["straight"]
    # The gradient norm that clipping uses is the global one, not a rank's shard's.
    assert torch.allclose(torch.tensor(one_losses), torch.tensor(two_losses), rtol=1e-5)
    _assert_states(one, two, exact=False)


def test_gradient_accumulation_equals_the_large_batch(one_process):
    (big_losses, big), (acc_losses, acc) = one_process["big"], one_process["accum"]
    assert torch.allclose(torch.tensor(acc_losses), torch.tensor(big_losses), rtol=1e-5)
    _assert_states(big, acc, exact=False)
