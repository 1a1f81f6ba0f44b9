"""Sharded checkpoints with torch.distributed.checkpoint, persisted and registered by Ray Train.

Every rank writes its shard into a local directory and reports it; Ray Train merges the ranks'
files in storage and registers the checkpoint only once every rank has uploaded, so a save killed
half-way is never what `ray.train.get_checkpoint()` returns. DCP writes `.metadata` last, and
`load` refuses a directory without it.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ray.train
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from training.engine import Engine

STATE_FILE = "train_state.json"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed from."""


@dataclass(frozen=True)
class Position:
    step: int
    data_position: int


def save_and_report(engine: Engine, position: Position, metrics: dict) -> None:
    """Collective: every rank must call it at the same step."""
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    with tempfile.TemporaryDirectory(prefix="ckpt-") as local:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=local)
        if dist.get_rank() == 0:
            Path(local, STATE_FILE).write_text(json.dumps(position.__dict__))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(local),
                         checkpoint_dir_name=f"checkpoint-step{position.step:07d}")


def load(checkpoint: ray.train.Checkpoint, engine: Engine) -> Position:
    """Restore model and optimizer shards in place; returns where training stopped."""
    with checkpoint.as_directory() as d:
        if not Path(d, ".metadata").exists() or not Path(d, STATE_FILE).exists():
            raise CheckpointError(f"checkpoint {checkpoint.path} is incomplete (no DCP metadata "
                                  "or train state); delete it to resume from the one before")
        position = Position(**json.loads(Path(d, STATE_FILE).read_text()))
        model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=d)
    set_state_dict(engine.model, engine.optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return position
