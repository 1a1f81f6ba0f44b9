"""Test hooks (hidden flags), called by the loop at two named points: before a step
(--nan-at-step) and after it (--fault-at-step, --fault-in-save-at-step). Each fires only in a
fresh run, so that a retried attempt shows whether the job recovered."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from training.config import TrainConfig
from training.run.checkpoint import Saver
from training.step.engine import Engine


@dataclass(frozen=True)
class FaultHooks:
    nan_at_step: int | None
    fault_at_step: int | None
    fault_in_save_at_step: int | None
    fresh: bool  # this attempt did not resume from a checkpoint
    dies: bool  # the rank that dies: the last one

    @classmethod
    def for_rank(cls, cfg: TrainConfig, resumed: bool, rank: int, world: int) -> "FaultHooks":
        return cls(cfg.nan_at_step, cfg.fault_at_step, cfg.fault_in_save_at_step,
                   fresh=not resumed, dies=rank == world - 1)

    def before_step(self, step: int, engine: Engine) -> None:
        """--nan-at-step: turn one weight shard into NaN, as a diverging run would."""
        if self.nan_at_step == step and self.fresh:
            with torch.no_grad():
                p = next(engine.model.parameters())
                (p.to_local() if isinstance(p, DTensor) else p).fill_(float("nan"))

    def after_step(self, step: int, saver: Saver) -> None:
        """The last rank dies once, at the end of that step with no grace period:
        --fault-at-step right after its checkpoint completed (when it saves one),
        --fault-in-save-at-step while its asynchronous checkpoint is still in flight."""
        if self.fault_at_step == step:
            saver.wait()  # collective: every rank completes the save first
        if step in (self.fault_at_step, self.fault_in_save_at_step) and self.fresh and self.dies:
            os._exit(17)
