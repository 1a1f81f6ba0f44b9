"""Held-out loss: the evaluation set's summed loss over its labelled tokens on every rank,
divided by their count (both reduced across ranks), with the training step's masking, in eval
mode (no dropout: `--lora-dropout` would make it noisy and draw from the training RNG, as HF
Trainer's `evaluation_loop` calls `model.eval()` for the same reason)."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from training.config import TrainConfig
from training.data.packing import Batch, Samples
from training.data.prepare import EvalSet
from training.step.engine import Engine
from training.model.dpo import eval_mode
from training.model.loss import label_count
from training.step.memory import BatchPlan


class Evaluator:
    """This rank's share of the evaluation set, read once; when to evaluate."""

    def __init__(self, batches: list[Batch], every: int, steps: int):
        self.batches, self.every, self.steps = batches, every, steps

    @classmethod
    def for_run(cls, fs, evaluated: EvalSet | None, cfg: TrainConfig, batch: BatchPlan,
                rank: int, world: int) -> "Evaluator | None":
        """None when the run has no evaluation set (PreparedData.eval)."""
        if evaluated is None:
            return None
        samples = Samples(fs, evaluated.directory, evaluated.file, evaluated.count_key)
        return cls(samples.eval_batches(rank=rank, world=world, batch=batch.micro_batch_size),
                   cfg.eval_every, cfg.steps)

    def due(self, step: int) -> bool:
        """After step `step` (0: before the first)? Before the first, every --eval-every, last."""
        return step in (0, self.steps) or bool(self.every) and step % self.every == 0

    def loss(self, engine: Engine) -> float:
        """Collective: every rank runs the same number of forwards (FSDP gathers in them)."""
        device = engine.device
        totals = torch.zeros(2, dtype=torch.float64, device=device)
        one = torch.ones((), device=device)
        with torch.no_grad(), eval_mode(engine.model):
            for b in self.batches:
                b = b.to(device)
                totals[0] += engine.model(b.inputs, b.labels, b.positions, normalizer=one)
                totals[1] += label_count(b.labels)
        if dist.is_initialized():
            dist.all_reduce(totals)
        return float(totals[0] / totals[1].clamp(min=1))


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 700.0))  # beyond that, exp overflows a float
