"""Test hooks (TrainConfig.test_hooks: flags of their own group, no settings of a run), called
by the loop at named points: as the model's load begins (--hold-at-step 0), before a step
(--nan-at-step) and after it (--fault-at-step, --fault-in-save-at-step, --hold-at-step), and at
a save (--stall-upload-at-step). The fault hooks
fire only in a fresh run, so that a retried attempt shows whether the job recovered; the
preemption hooks once per run (a marker in the run directory's test-hooks/, which also tells a
test where and when they fired)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pyarrow.fs as pafs
import ray
import ray.train
import ray.train.collective
import torch
from torch.distributed.tensor import DTensor

from training.config import TestHooks, TrainConfig
from training.run.checkpoint import Saver
from training.run.run_files import RunFiles
from training.step.engine import Engine


@dataclass(frozen=True)
class FaultHooks:
    """The run's test hooks as one rank fires them."""
    given: TestHooks
    fresh: bool  # this attempt did not resume from a checkpoint
    dies: bool  # the rank that dies: the last one
    rank: int = 0

    @classmethod
    def for_rank(cls, cfg: TrainConfig, resumed: bool, rank: int, world: int) -> "FaultHooks":
        return cls(cfg.test_hooks, fresh=not resumed, dies=rank == world - 1, rank=rank)

    def before_step(self, step: int, engine: Engine) -> None:
        """--nan-at-step: turn one weight shard into NaN, as a diverging run would."""
        if self.given.nan_at_step == step and self.fresh:
            with torch.no_grad():
                p = next(engine.model.parameters())
                (p.to_local() if isinstance(p, DTensor) else p).fill_(float("nan"))

    def after_step(self, step: int, saver: Saver) -> None:
        """The last rank dies once, at the end of that step with no grace period:
        --fault-at-step right after its checkpoint completed (when it saves one),
        --fault-in-save-at-step while its asynchronous checkpoint is still in flight."""
        given = self.given
        if given.fault_at_step == step:
            saver.wait()  # collective: every rank completes the save first
        if step in (given.fault_at_step, given.fault_in_save_at_step) and self.fresh and self.dies:
            os._exit(17)

    def holds(self, step: int) -> bool:
        """Collective at the --hold-at-step step: whether training waits here for a preemption
        (once per run)."""
        if self.given.hold_at_step != step:
            return False
        return ray.train.collective.broadcast_from_rank_zero(
            self.rank == 0 and _claim(f"held-at-step-{step}"))

    def stalls(self, step: int) -> bool:
        """--stall-upload-at-step: whether this rank's upload of this step never ends (rank 0,
        once per run; the other ranks' uploads then wait for it)."""
        return self.given.stall_upload_at_step == step and self.rank == 0 and \
            _claim(f"stalled-upload-{step}")


def hold_in_load(cfg: TrainConfig, rank: int, polls: int = 1500) -> None:
    """Collective, --hold-at-step 0 (once per run): every worker waits as its model's load
    begins, with nothing saved yet, until Ray Train stops the attempt for a preemption (at most
    `polls` x 0.2 s). The window that for a 7B model lasts minutes, without a sleep race."""
    if cfg.test_hooks.hold_at_step != 0 or not ray.train.collective.broadcast_from_rank_zero(
            rank == 0 and _claim("held-at-step-0")):
        return
    for _ in range(polls):
        time.sleep(0.2)
    raise RuntimeError("--hold-at-step 0: no preemption came")


def _claim(name: str) -> bool:
    """Create test-hooks/<name> in the run directory, holding this node's Ray id; False when it
    exists (the hook fired in an earlier attempt)."""
    files = RunFiles.from_context()
    path = f"{files.run_dir}/test-hooks/{name}"
    if files.fs.get_file_info(path).type != pafs.FileType.NotFound:
        return False
    files.fs.create_dir(f"{files.run_dir}/test-hooks", recursive=True)
    with files.fs.open_output_stream(path) as f:
        f.write(ray.get_runtime_context().get_node_id().encode())
    return True
