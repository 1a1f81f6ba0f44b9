"""What defines a run, kept in its directory (`run.json`), so a rerun under the same --name with
other defining settings is refused on the driver in one line naming each difference, before the
data is tokenized or Ray starts (a finished run would otherwise print its old summary; a resumed
one would fail inside every worker as the checkpoint's keys or adapters do not match)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from training.config import TrainConfig
from training.errors import InputError

if TYPE_CHECKING:
    from training.storage import Storage

RECORD_FILE = "run.json"
DEFINING = ("model", "tokenizer", "data", "seq_len", "seed", "loss_tokens", "eval_fraction",
            "objective", "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules",
            "load_in_4bit")
"""Settings a checkpoint's weights, adapters or data position depend on (the held-out fraction
picks which documents train); the rest (steps, lr, logging, evaluation...) may change between a
run's attempts. Those in the run's name (training/run_names.py) differ only under a --name."""


class OtherRunError(InputError):
    """--name names a run trained with other defining settings."""


def defining(cfg: TrainConfig) -> dict:
    return {key: getattr(cfg, key) for key in DEFINING}


def check(cfg: TrainConfig, storage: Storage) -> None:
    """Refuse settings that differ from those the run's checkpoints were saved with; a run
    without a checkpoint yet (new, or stopped before its first save) starts over under these
    settings."""
    from training.run.checkpoint import latest
    from training.run.run_files import RunFiles

    run_dir = storage.run_dir(cfg.name)
    if latest(storage.filesystem, run_dir, None) is None:
        return
    saved = RunFiles(storage.filesystem, run_dir).read_json(RECORD_FILE)
    if saved is None:  # written before runs recorded their settings: the workers check them
        return
    ours = defining(cfg)
    differs = [key for key in DEFINING if key in saved and saved[key] != ours[key]]
    if differs:
        raise OtherRunError(
            f"run {cfg.name!r} ({storage.display(run_dir)}) was trained with "
            f"{_flags(saved, differs)}, this run asks {_flags(ours, differs)}: rerun with its "
            f"settings to continue it, or start a new run with --name {suggest(cfg, differs)}")


def record(cfg: TrainConfig, storage: Storage) -> None:
    """Record the settings of a run about to train that has no checkpoint yet (one that has was
    checked against them); the driver calls it once nothing refused the run, so a refused run
    writes nothing."""
    from training.run.checkpoint import latest
    from training.run.run_files import RunFiles

    run_dir = storage.run_dir(cfg.name)
    if latest(storage.filesystem, run_dir, None) is None:
        RunFiles(storage.filesystem, run_dir).write_json(RECORD_FILE, defining(cfg))


def suggest(cfg: TrainConfig, differs: list[str]) -> str:
    """A run name for the new settings: the old name and what changed, e.g. `demo-lora-rank-8`."""
    parts = [f"{key.replace('_', '-')}-{_short(getattr(cfg, key))}" for key in differs[:2]]
    return "-".join([cfg.name, *parts])


def _short(value) -> str:
    text = str(value).rstrip("/").rsplit("/", 1)[-1]
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in text)[:24]


def _flags(values: dict, keys: list[str]) -> str:
    return ", ".join(f"--{key.replace('_', '-')} {json.dumps(values[key])}" for key in keys)
