"""The driver's checks before Ray starts: model reachable, tokenizer for text, sequence length
within the model's positions, a batch plan that fits --memory-budget-gib, and a resume on the
same data. Each failure is an InputError naming the flag, before any cluster time is spent."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from training.config import RANDOM_DATA, ConfigError, TrainConfig
from training.data import DataError
from training.data.prepare import tokenizer_name
from training.data.tokenize import BYTES, encoder
from training.model.loading import ModelError

if TYPE_CHECKING:
    from training.storage import Storage


def check_model_and_data(cfg: TrainConfig) -> int | None:
    """Fail before Ray starts: model reachable, tokenizer for text, seq_len within positions,
    the batch plan within the memory budget. Returns the vocabulary a built-in shape takes from
    the tokenizer (None: the model's own)."""
    from training.model.model import is_builtin, max_positions, model_config

    vocab = None
    if cfg.data not in RANDOM_DATA:
        if not _data_exists(cfg.data):
            raise DataError(f"--data {cfg.data!r}: no such file or directory (or not one of "
                            f"{RANDOM_DATA})")
        tok_name = tokenizer_name(cfg)
        if is_builtin(tok_name) and tok_name != BYTES:
            raise ModelError(f"--data text needs a tokenizer: pass --tokenizer (a Hugging Face id "
                             f"or directory) with the built-in shape {cfg.model!r}")
        tok_vocab = _tokenizer_vocab(tok_name)  # loads it: a bad --tokenizer fails here
        vocab = tok_vocab if is_builtin(cfg.model) else None
    config = model_config(cfg.model, vocab)
    limit = max_positions(config)
    if limit and cfg.seq_len > limit:
        raise ConfigError([f"--seq-len {cfg.seq_len} is beyond the model's {limit} positions "
                           f"(max_position_embeddings); use --seq-len {limit} or less"])
    check_memory_budget(cfg, config)
    return vocab


def check_memory_budget(cfg: TrainConfig, config) -> None:
    """A micro-batch that cannot fit --memory-budget-gib even with activation checkpointing is
    refused here (the batch plan the workers will make, memory.plan_batch), not met as a CUDA
    out-of-memory error inside a worker. LoRA targets the model lacks fail here too."""
    from training.model.lora import LoraSpec, count_on_meta
    from training.step.memory import Footprint, plan_batch

    spec = LoraSpec.from_config(cfg)
    if cfg.memory_budget_gib is None and spec is None:
        return
    num_params, trainable = count_on_meta(config, spec)
    if cfg.memory_budget_gib is None:
        return
    # Plain FSDP unless --hsdp-replicas says otherwise: the driver does not know the nodes yet;
    # each worker plans again with the mesh it builds (engine.resolve_plan).
    shard = max(1, cfg.num_workers // (cfg.hsdp_replicas or 1))
    fp = Footprint(config, num_params, shard, int(cfg.memory_budget_gib * 2**30),
                   compiled=cfg.compile is not False, world=cfg.num_workers,  # a budget: GPUs
                   trainable_params=trainable if spec else None,
                   lora_dropout=bool(spec and spec.dropout))
    plan_batch(cfg, fp, cfg.num_workers, note=f" (--memory-budget-gib {cfg.memory_budget_gib})")


def _data_exists(uri: str) -> bool:
    return "://" in uri or Path(uri).exists()


def _tokenizer_vocab(name: str) -> int:
    try:
        return encoder(name).vocab_size()
    except (OSError, ValueError) as e:
        raise ModelError(f"--tokenizer {name!r}: cannot load it ({str(e).splitlines()[0]})") from None


def check_resume(cfg: TrainConfig, storage: Storage, data_id: str) -> None:
    """Before Ray starts: refuse to resume a run on other data, and say now how its saved
    learning-rate schedule will continue."""
    from training.run.checkpoint import STATE_FILE, CheckpointError, RunState, latest
    from training.run.loop import start_state

    ckpt = latest(storage.filesystem, storage.run_dir(cfg.name), None)
    if ckpt is None:
        return
    with storage.filesystem.open_input_stream(f"{ckpt.path}/{STATE_FILE}") as f:
        text = f.read().decode()
    try:
        notes = start_state(cfg, RunState.from_json(text, storage.display(ckpt.path)), data_id)[2]
    except CheckpointError as e:
        raise DataError(str(e)) from None
    for note in notes:
        print(f"WARNING: {note}", file=sys.stderr)
