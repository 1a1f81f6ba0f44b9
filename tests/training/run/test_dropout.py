"""A run with dropout (`--lora-dropout`) on real FSDP2 gloo ranks (tests/training/inproc.py):
seeded per step from (seed, step, rank), a resumed run equals an uninterrupted one bitwise, as
with dropout 0; unseeded it does not (the check can fail). Evaluation runs without dropout: the
same batch twice gives the same loss, and draws nothing from the training RNG."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.training.inproc import run_ranks
from training.config import TrainConfig
from training.data.packing import Batch
from training.model.model import model_config
from training.run import checkpoint, rng
from training.run.evaluate import Evaluator
from training.step.engine import build_engine, mean_across_ranks, train_step

STEPS, HALF, ROWS, SEQ = 6, 3, 2, 16
CFG = TrainConfig(model="tiny", seq_len=SEQ, lr=1e-2, warmup_steps=0, grad_clip=0.0,
                  lora_rank=4, lora_alpha=8.0, lora_dropout=0.3, seed=0, use_gpu=False)


def _batch(step: int) -> Batch:
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    ids = torch.randint(0, 512, (ROWS, SEQ + 1), generator=g)
    return Batch(ids[:, :-1], ids[:, 1:])


def _train(engine, steps, seeded: bool) -> list[float]:
    out = []
    for step in steps:
        if seeded:
            rng.seed_step(CFG.seed, step, dist.get_rank())
        out.append(mean_across_ranks(train_step(engine, [_batch(step)], CFG.lr, 0.0)))
    return out


def _adapters(engine) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=True))
    return {k: v.clone() for k, v in full.items() if ".lora_" in k}


def _on_ranks(ckpt: str, seeded: bool) -> dict:
    cpu = torch.device("cpu")
    straight = build_engine(CFG, model_config("tiny"), cpu)
    evaluator = Evaluator([_batch(99)], every=0, steps=STEPS)
    before = torch.random.get_rng_state()
    evals = [evaluator.loss(straight), evaluator.loss(straight)]
    untouched = torch.equal(before, torch.random.get_rng_state())
    losses = _train(straight, range(1, STEPS + 1), seeded)
    first = build_engine(CFG, model_config("tiny"), cpu)
    head = _train(first, range(1, HALF + 1), seeded)
    checkpoint.save_local(first, checkpoint.RunState(step=HALF), ckpt)
    # The same --seed (a built-in shape's frozen base is drawn from it); the trained adapters
    # come from the checkpoint alone.
    resumed = build_engine(CFG, model_config("tiny"), cpu)
    checkpoint.load_local(resumed, ckpt)
    torch.rand(7)  # a restarted process's generator is wherever its start left it
    tail = _train(resumed, range(HALF + 1, STEPS + 1), seeded)
    return {"evals": evals, "eval_rng_untouched": untouched, "losses": losses,
            "resumed_losses": head + tail, "straight": _adapters(straight),
            "resumed": _adapters(resumed)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {seeded: run_ranks(2, _on_ranks, str(tmp_path_factory.mktemp("ckpt")), seeded)[0]
            for seeded in (True, False)}


def test_evaluation_runs_without_dropout_and_leaves_the_training_rng_alone(runs):
    r = runs[True]
    assert r["evals"][0] == r["evals"][1] and r["eval_rng_untouched"]


def test_a_dropout_run_seeded_per_step_resumes_bitwise(runs):
    r = runs[True]
    assert r["losses"] == r["resumed_losses"]
    for name, value in r["straight"].items():
        assert torch.equal(value, r["resumed"][name]), name


def test_without_per_step_seeds_the_same_resume_differs(runs):
    r = runs[False]
    assert r["losses"][:HALF] == r["resumed_losses"][:HALF]  # same start, same draws
    assert r["losses"][HALF:] != r["resumed_losses"][HALF:]
