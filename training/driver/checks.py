"""The driver's checks before Ray starts: model reachable, tokenizer for text, sequence length
within the model's positions, a resume on the same data, and a run that is finished already
(driver/plan.py calls them in one pass, with the memory check). Each failure is an InputError
naming the flag, before any cluster time is spent."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from training.config import ConfigError, TrainConfig
from training.data import DataError
from training.data.prepare import tokenizer_name
from training.data.tokenize import BYTES, Encoder, encoder
from training.model.loading import ModelError

if TYPE_CHECKING:
    from training.run.handoff import Resume, RunSummary
    from training.storage import Storage


def absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """--model and --tokenizer that name local directories, and --data and --eval-data that
    name local files or folders, made absolute once here: the workers (another working
    directory: their --sample-prompts read the data) and the export read them as the driver
    does. (--harness-tasks' paths: evals/tasks.py `checked`.)"""
    local = {"model": os.path.isdir, "tokenizer": os.path.isdir, "data": os.path.exists,
             "eval_data": os.path.exists}
    fixed = {name: os.path.abspath(value) for name, exists in local.items()
             if (value := getattr(cfg, name)) and exists(value) and not os.path.isabs(value)}
    return dataclasses.replace(cfg, **fixed)


def check_model(cfg: TrainConfig, tokenizer_vocab: int | None):
    """The model's shape (a PretrainedConfig), reachable, of a supported family
    (model/families.py), with --seq-len within its positions; a built-in shape takes the tokenizer's vocabulary (`tokenizer_vocab`, None: random tokens)."""
    from training.model.families import check
    from training.model.model import is_builtin, max_positions, model_config

    config = model_config(cfg.model, tokenizer_vocab if is_builtin(cfg.model) else None)
    _, limits = check(config, cfg.allow_untested_architecture)  # outside the table: refused
    if limits:
        print(f"warning: {limits}", flush=True)
    limit = max_positions(config)
    if limit and cfg.seq_len > limit:
        raise ConfigError([f"--seq-len {cfg.seq_len} is beyond the model's {limit} positions "
                           f"(max_position_embeddings); use --seq-len {limit} or less"])
    return config


def check_data_and_tokenizer(cfg: TrainConfig) -> Encoder:
    """--data has a tokenizer: --tokenizer (a built-in shape has none of its own), loaded here,
    so a bad one fails now (that --data exists: driver/early.py, before the heavy imports)."""
    from training.data.hub import offline_reason, offline_unless_reachable
    from training.model.model import is_builtin

    tok_name = tokenizer_name(cfg)
    offline_unless_reachable([cfg.data, cfg.eval_data, tok_name, cfg.model])
    if is_builtin(tok_name) and tok_name != BYTES:
        raise ModelError(f"--data {cfg.data!r} needs a tokenizer with the built-in shape "
                         f"{cfg.model!r}: pass --tokenizer {BYTES} (UTF-8 bytes, built in) "
                         "or a Hugging Face tokenizer id or directory")
    try:
        return encoder(tok_name)
    except (OSError, ValueError) as e:
        raise ModelError(f"--tokenizer {tok_name!r}: cannot load it "
                         f"({offline_reason() or str(e).splitlines()[0]})") from None


# The shortest row of each format that trains anything: one character of prompt, one of answer.
_SHORTEST = {"messages": lambda enc: enc.chat([{"role": "user", "content": "?"},
                                               {"role": "assistant", "content": "!"}]),
             "prompt-completion": lambda enc: enc.prompt_completion("?", "!")}


def check_room(cfg: TrainConfig, enc: Encoder, data_format: str) -> None:
    """--seq-len long enough for a prompt and its answer in this format and tokenizer: shorter,
    the packed windows cut most answers off their prompts and steps train nothing."""
    shortest = _SHORTEST.get(data_format)
    if shortest is None:  # plain text: every token is trained
        return
    need = len(shortest(enc)[0])
    if cfg.seq_len < need:
        raise ConfigError([f"--seq-len {cfg.seq_len} cannot hold a prompt and an answer: the "
                           f"shortest {data_format} row is {need} tokens with tokenizer "
                           f"{tokenizer_name(cfg)!r}; use --seq-len {need} or more"])


def check_resume(cfg: TrainConfig, storage: Storage, data_id: str) -> Resume | None:
    """Before Ray starts: refuse to resume a run on other data, and say how its saved
    learning-rate schedule will continue."""
    from training.run.checkpoint import STATE_FILE, CheckpointError, RunState, latest, start_state
    from training.run.handoff import Resume

    ckpt = latest(storage.filesystem, storage.run_dir(cfg.name), None)
    if ckpt is None:
        return None
    with storage.filesystem.open_input_stream(f"{ckpt.path}/{STATE_FILE}") as f:
        text = f.read().decode()
    where = storage.display(ckpt.path)
    try:
        state, _, notes = start_state(cfg, RunState.from_json(text, where), data_id)
    except CheckpointError as e:
        raise DataError(str(e)) from None
    return Resume(where, state.step, notes)


def saved_summary(cfg: TrainConfig, storage: Storage) -> RunSummary | None:
    """The summary rank 0 last wrote to the run directory, or None (no run yet)."""
    from training.run.handoff import SUMMARY_FILE, RunSummary
    from training.run.run_files import RunFiles

    text = RunFiles(storage.filesystem, storage.run_dir(cfg.name)).read_bytes(SUMMARY_FILE)
    return RunSummary.from_json(text.decode()) if text else None


def finished(cfg: TrainConfig, storage: Storage) -> RunSummary | None:
    """The summary of a run that already trained its --steps and did not stop early (a rerun
    leaves its results alone), else None."""
    summary = saved_summary(cfg, storage)
    if summary is None or summary.stopped or (summary.steps or 0) < cfg.steps:
        return None
    return summary
