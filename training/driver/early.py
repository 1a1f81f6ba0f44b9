"""The checks that refuse a run before torch, transformers or Ray is imported (10-20 s of
imports on a laptop): local data files that are missing or not data, model directories that are
missing or not a model, and Hub ids that cannot be read because the Hub is unreachable and the
local cache has no copy. The flags and settings are checked before this (cli.parse_args); what
needs the model's classes or the tokenizer (driver/checks.py) follows once they are imported.

Standard library, pyarrow and huggingface_hub only: tests/training/driver/test_cli.py runs every
refusal here and asserts that none of the heavy libraries was imported."""

from __future__ import annotations

import os

from training.config import RANDOM_DATA, TrainConfig
from training.data import DataError, hub
from training.data.source import Source
from training.model.loading import (CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX, ModelError,
                                    check_model_dir, looks_like_path)

TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
"""A tokenizer in the hub cache: AutoTokenizer reads its config first, or a fast tokenizer's own
file."""


def check(cfg: TrainConfig) -> None:
    """Every check that needs none of the heavy libraries, in the order a run meets them."""
    files = cfg.data not in RANDOM_DATA
    hub.offline_unless_reachable([cfg.data, cfg.eval_data, cfg.model,
                                  cfg.tokenizer if files else None])
    for flag, uri in (("--data", cfg.data), ("--eval-data", cfg.eval_data)):
        if uri and uri not in RANDOM_DATA:
            check_data(uri, flag)
    check_model(cfg.model)
    if os.path.isdir(cfg.model):  # a model outside the supported families, from config.json
        from training.model.families import check_local_dir

        check_local_dir(cfg.model, cfg.allow_untested_architecture)
    if files and cfg.tokenizer:
        check_hub_id(cfg.tokenizer, "--tokenizer", TOKENIZER_FILES)


def check_data(uri: str, flag: str) -> None:
    """A local file or directory that exists and holds data files whose first row reads; a Hub
    dataset, offline, in the local cache. S3, and the Hub online, are read once, later."""
    if hub.is_hub(uri):
        if _offline():
            Source.open(uri, flag)  # the cache only: fails now, naming the unreachable Hub
        return
    if "://" in uri:
        return
    if not os.path.exists(uri):
        what = f" (or {' or '.join(RANDOM_DATA)})" if flag == "--data" else ""
        raise DataError(f"{flag} {uri!r}: no such file or directory{what}")
    next(Source.open(uri, flag).rows(), None)  # a file that is not JSON Lines or Parquet


def check_model(spec: str) -> None:
    """A model directory holds a model; a path that is none is named; a Hub id is in the cache
    when the Hub cannot be reached. An `s3://` model is read once, later, with the run's
    credentials."""
    if "://" in spec:
        return
    if os.path.isdir(spec):
        check_model_dir(spec)
    elif looks_like_path(spec):
        raise ModelError(f"--model {spec!r}: no such model directory")
    elif hub.is_repo_id(spec):
        check_hub_id(spec, "--model", (CONFIG_FILE,), (WEIGHTS_FILE, WEIGHTS_INDEX))


def check_hub_id(name: str, flag: str, *needs: tuple[str, ...]) -> None:
    """Offline (the Hub unreachable, or HF_HUB_OFFLINE), `name` must be in the local hub cache
    with one file of each of `needs`: otherwise huggingface_hub would fail later, in a worker,
    after its retries. Online, the download is the loaders' own."""
    from huggingface_hub import try_to_load_from_cache

    if not _offline() or os.path.isdir(name) or not hub.is_repo_id(name):
        return
    if all(any(isinstance(try_to_load_from_cache(name, f), str) for f in files)
           for files in needs):
        return
    from huggingface_hub import constants

    why = hub.offline_reason() or "HF_HUB_OFFLINE is set and the local cache has no copy"
    raise ModelError(f"{flag} {name!r}: {why}; give a local directory, an s3:// one, or "
                     f"network access to {constants.ENDPOINT}")


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)
