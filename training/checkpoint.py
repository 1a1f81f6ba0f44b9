"""Sharded checkpoints with torch.distributed.checkpoint (DCP), and which one a run resumes from.

Every rank writes its shard into a local directory and reports it; in Ray Train's default SYNC
mode `ray.train.report` returns only after this rank's files are in storage
(ray/train/v2/_internal/execution/context.py, `report` -> `_upload_checkpoint`). After a barrier,
rank 0 writes the `COMPLETE` marker, so a marked directory holds every rank's files.

Ray Train itself registers a reported checkpoint only on its controller's next poll (about every
2 s); a worker dying in that window loses the registration, not the files. A run therefore
resumes from the newest checkpoint that is marked complete or registered, whichever is newer.
Torn directories (no marker, never registered) are never loaded.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow.fs as pafs
import ray.train
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from training.engine import Engine
from training.model import tied_aliases
from training.run_files import RunFiles

STATE_FILE = "train_state.json"
MARKER = "COMPLETE"
_DIR = re.compile(r"^checkpoint-step(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or resumed from."""


@dataclass(frozen=True)
class RunState:
    """What a checkpoint records besides the weights and optimizer state."""
    step: int
    samples_seen: int = 0  # sequences consumed across all ranks (text data)
    first_loss: float | None = None  # the run's, not the attempt's
    first_eval_loss: float | None = None  # before the run's first step
    schedule: dict = field(default_factory=dict)  # training.schedule.Schedule.to_dict()
    data: str | None = None  # fingerprint of the tokenized text (training.data.cache.TokenCache)

    @classmethod
    def from_json(cls, text: str, where: str) -> "RunState":
        """The state a checkpoint recorded; one written by an older version of the job (no
        sample position or schedule) is refused with what to do, not a TypeError per worker."""
        try:
            saved = json.loads(text)
            if not isinstance(saved, dict) or "schedule" not in saved:
                raise ValueError("no schedule")
            return cls(**saved)
        except (TypeError, ValueError):
            raise CheckpointError(
                f"checkpoint {where} was written by an older version of the job (no sample "
                "position or learning-rate schedule): start a new run (another --name, or "
                "another model/data on a stack) or delete that checkpoint") from None


def dir_name(step: int) -> str:
    return f"checkpoint-step{step:07d}"


def save_local(engine: Engine, state: RunState, directory: str) -> None:
    """Collective: every rank writes its shards of model and optimizer into `directory`; tied
    parameters are stored once (get_state_dict lists the tied LM head under both names)."""
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    for alias in tied_aliases(engine.model):
        model_sd.pop(alias, None)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=directory)
    if dist.get_rank() == 0:
        Path(directory, STATE_FILE).write_text(json.dumps(asdict(state)))


def load_local(engine: Engine, directory: str) -> RunState:
    """Restore model and optimizer shards in place from `directory`; returns the run state."""
    if not Path(directory, ".metadata").exists() or not Path(directory, STATE_FILE).exists():
        raise CheckpointError(f"checkpoint {directory} is incomplete (no DCP metadata or train "
                              "state); delete it to resume from the one before")
    state = RunState.from_json(Path(directory, STATE_FILE).read_text(), directory)
    model_sd, optim_sd = get_state_dict(engine.model, engine.optimizer)
    aliases = tied_aliases(engine.model)
    loaded = {"model": {k: v for k, v in model_sd.items() if k not in aliases}, "optim": optim_sd}
    dcp.load(loaded, checkpoint_id=directory)
    for alias, canonical in aliases.items():
        loaded["model"][alias] = loaded["model"][canonical]
    set_state_dict(engine.model, engine.optimizer, model_state_dict=loaded["model"],
                   optim_state_dict=loaded["optim"])
    return state


def save_and_report(engine: Engine, state: RunState, metrics: dict) -> None:
    """Collective: save, let Ray Train upload and register it, then mark it complete."""
    fs, run_dir = _storage()
    marker = f"{run_dir}/{dir_name(state.step)}/{MARKER}"
    if dist.get_rank() == 0 and fs.get_file_info(marker).type != pafs.FileType.NotFound:
        fs.delete_file(marker)  # re-saving a step (after resuming from an older checkpoint)
    dist.barrier()
    with tempfile.TemporaryDirectory(prefix="ckpt-") as local:
        save_local(engine, state, local)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(local),
                         checkpoint_dir_name=dir_name(state.step))
    dist.barrier()  # every rank's upload has returned
    if dist.get_rank() == 0:
        with fs.open_output_stream(marker) as f:
            f.write(b"all ranks uploaded\n")


def latest(fs: pafs.FileSystem, run_dir: str,
           registered: ray.train.Checkpoint | None) -> ray.train.Checkpoint | None:
    """The newest checkpoint that is marked complete or registered by Ray Train."""
    best_step, best = -1, registered
    if registered is not None and (m := _DIR.match(Path(registered.path).name)):
        best_step = int(m.group(1))
    listing = fs.get_file_info(pafs.FileSelector(run_dir, allow_not_found=True))
    for info in listing:
        m = _DIR.match(info.base_name)
        if m and info.type == pafs.FileType.Directory and int(m.group(1)) > best_step and \
                fs.get_file_info(f"{info.path}/{MARKER}").type == pafs.FileType.File:
            best_step, best = int(m.group(1)), ray.train.Checkpoint(info.path, filesystem=fs)
    return best


def resume(engine: Engine) -> RunState | None:
    """Load the run's newest complete checkpoint, if any."""
    fs, run_dir = _storage()
    ckpt = latest(fs, run_dir, ray.train.get_checkpoint())
    if ckpt is None:
        return None
    with ckpt.as_directory() as d:
        return load_local(engine, d)


def _storage() -> tuple[pafs.FileSystem, str]:
    files = RunFiles.from_context()
    return files.fs, files.run_dir
