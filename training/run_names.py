"""A run's name from what defines it, one rule for the stack's RayJobs (workloads/rayjob.py
`run_name`: `<cluster>-run-<key>`) and a run without --name (`<model>-<key>`).

The same model, data and sequence length keep one name, so a rerun with more steps resumes the
run; another dataset or model is another run instead of a refusal. A LoRA run and a DPO run are
runs of their own (their checkpoints hold adapters, or start from another objective), while a
full fine-tune keeps the key it always had: the stack's existing runs keep their names.
Settings outside the key that a checkpoint still depends on (the seed, the loss's tokens...)
are compared with the run's run.json (training/driver/run_record.py), which names each one that
differs.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from training.config import TrainConfig

KEY_LEN = 8


def run_key(cfg: TrainConfig) -> str:
    """Hex digits that change with the model, the data, the sequence length, a LoRA's rank,
    alpha and targets and a non-default objective, and with nothing else."""
    lora = [cfg.lora_rank, cfg.lora_alpha, cfg.lora_target_modules] if cfg.lora_rank else []
    objective = [cfg.objective] if cfg.objective != "sft" else []
    key = json.dumps([cfg.model, cfg.data, cfg.seq_len, *lora, *objective])
    return hashlib.sha256(key.encode()).hexdigest()[:KEY_LEN]


def default_name(cfg: TrainConfig) -> str:
    """The name of a run given no --name: the model's last path part and the run's key, e.g.
    `tiny-3f2a9c1e` (`Qwen2.5-1.5B-...` for `Qwen/Qwen2.5-1.5B`)."""
    model = str(cfg.model).rstrip("/").rsplit("/", 1)[-1]
    model = "".join(c if c.isalnum() or c in "._-" else "-" for c in model)[:40] or "model"
    return f"{model}-{run_key(cfg)}"


def named_after(cfg: TrainConfig, name: str, reference: TrainConfig) -> str:
    """`name` for the run `reference` defines (`make demo`'s `demo`), `<name>-<key>` for a run
    with another key, so that one never resumes, or is refused by, the other."""
    key = run_key(cfg)
    return name if key == run_key(reference) else f"{name}-{key}"
