"""The two models the evaluation compares, loaded whole on each worker's device after the export
(FSDP's shards are gathered already): the base --model (a built-in shape: its random init, from
--seed on the same device, as training started from) and the exported fine-tune (for LoRA, the
merged export). The tokenizer is the export's, so the built-in byte tokenizer works as any."""

from __future__ import annotations

from typing import Iterator

import torch

from training.config import TrainConfig

BASE, TUNED = "base", "tuned"


def eval_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load(which: str, cfg: TrainConfig, export_dir: str, device: torch.device):
    """`which` (BASE or TUNED) as a transformers model in eval mode on `device`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from training.model.loading import weights_dir
    from training.model.model import build_model, is_builtin

    dtype = eval_dtype(device)
    if which == BASE and is_builtin(cfg.model):
        config = AutoConfig.from_pretrained(export_dir)
        model = build_model(cfg.model, config, seed=cfg.seed, device=device)
    else:
        source = export_dir if which == TUNED else weights_dir(cfg.model)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    return model.to(device=device, dtype=dtype).eval()


def each(cfg: TrainConfig, export_dir: str, device: torch.device) -> Iterator[tuple[str, object]]:
    """(name, model) for the base, then the fine-tune: one on the device at a time."""
    for which in (BASE, TUNED):
        model = load(which, cfg, export_dir, device)
        yield which, model
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
