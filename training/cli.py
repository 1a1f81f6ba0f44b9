"""`python -m training`: the RayJob entrypoint and the local main job.

Parses and validates the flags, checks everything that can be checked before a worker starts
(model, tokenizer, sequence length, data, storage, cluster capacity), runs the TorchTrainer, and
prints one JSON summary as the last stdout line. Any failure is one `error:` line and a non-zero
exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

from training import quiet
from training.config import LOCAL_DEFAULTS, ConfigError, TrainConfig
from training.data import RANDOM_MODES, DataError, build_text_dataset
from training.flags import add_config_flags
from training.model import ModelError, is_builtin, max_positions, model_config
from training.ray_setup import init_ray
from training.storage import Storage, StorageError, check_writable, resolve

EXIT_FAILED, EXIT_BAD_INPUT = 1, 2
# On a cluster (--address) workers may still be joining when the job starts: KubeRay submits once
# every pod runs, a raylet registers moments later, a restarted worker pod takes minutes. A local
# Ray never grows, so there the check fails at once.
CAPACITY_WAIT_S, CAPACITY_POLL_S = 600.0, 10.0
# Set on the run's Ray head (workloads/raycluster.py): a file holding the head's start (epoch
# seconds), seconds after KubeRay creates the run's cluster, so waits count from there.
RUN_STARTED_ENV = "RUN_STARTED_AT_FILE"


class JobError(RuntimeError):
    """The training run failed; the message is the root cause."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m training", description=__doc__.split("\n")[0])
    ap.add_argument("--local", action="store_true", help="local Ray, 2 CPU workers, `tiny` model "
                    "(the defaults of a laptop run; other flags still apply)")
    add_config_flags(ap)
    return ap


def parse(argv: list[str] | None = None) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    local = args.pop("local")
    given = {k: v for k, v in args.items() if v is not None}
    base = dict(LOCAL_DEFAULTS) if local else {}
    return TrainConfig(**{**base, **given}).validated()


def main(argv: list[str] | None = None) -> int:
    _quiet_local_logs()
    try:
        cfg = parse(argv)
        summary = run(cfg)
    except (ConfigError, ModelError, DataError, StorageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(summary), flush=True)
    return 0


def run(cfg: TrainConfig) -> dict:
    job_started = time.time()
    vocab = _check_model_and_data(cfg)
    storage = resolve(cfg.storage_path)
    check_writable(storage)
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        init_ray(cfg.address)
    try:
        use_gpu = cfg.use_gpu if cfg.use_gpu is not None else ray.cluster_resources().get("GPU", 0) > 0
        waited = _check_capacity(cfg, use_gpu, ray.cluster_resources,
                                 CAPACITY_WAIT_S if cfg.address else 0.0)
        run_started = _run_started_at(job_started)
        clock = {"run_started_at": run_started,
                 "waited_for_workers_s": job_started - run_started + waited}
        datasets = None
        if cfg.data not in RANDOM_MODES:
            datasets = {"train": _text_dataset(cfg)}
        result = _fit(cfg, storage, vocab, use_gpu, datasets, clock)
    finally:
        if started_here:
            ray.shutdown()
    return _summary(result, storage, cfg)


def _check_model_and_data(cfg: TrainConfig) -> int | None:
    """Fail before Ray starts: model reachable, tokenizer for text, seq_len within positions."""
    vocab = None
    if cfg.data not in RANDOM_MODES:
        if not _data_exists(cfg.data):
            raise DataError(f"--data {cfg.data!r}: no such file or directory (or not one of "
                            f"{RANDOM_MODES})")
        tok_name = cfg.tokenizer or cfg.model
        if is_builtin(tok_name):
            raise ModelError(f"--data text needs a tokenizer: pass --tokenizer (a Hugging Face id "
                             f"or directory) with the built-in shape {cfg.model!r}")
        vocab = _tokenizer_vocab(tok_name) if is_builtin(cfg.model) else None
    config = model_config(cfg.model, vocab)
    limit = max_positions(config)
    if limit and cfg.seq_len > limit:
        raise ConfigError([f"--seq-len {cfg.seq_len} is beyond the model's {limit} positions "
                           f"(max_position_embeddings); use --seq-len {limit} or less"])
    return vocab


def _data_exists(uri: str) -> bool:
    return "://" in uri or Path(uri).exists()


def _tokenizer_vocab(name: str) -> int:
    from transformers import AutoTokenizer

    try:
        return len(AutoTokenizer.from_pretrained(name))
    except (OSError, ValueError) as e:
        raise ModelError(f"--tokenizer {name!r}: cannot load it ({str(e).splitlines()[0]})") from None


def _text_dataset(cfg: TrainConfig):
    uri = cfg.data if "://" in cfg.data else os.path.abspath(cfg.data)
    tok = cfg.tokenizer or cfg.model
    tok = os.path.abspath(tok) if os.path.isdir(tok) else tok
    ds = build_text_dataset(uri, tok, cfg.seq_len)
    if not ds.take(1):
        raise DataError(f"--data {cfg.data!r} holds no text (or too little to fill one "
                        f"{cfg.seq_len + 1}-token block); add text or lower --seq-len")
    return ds


def _check_capacity(cfg: TrainConfig, use_gpu: bool, resources: Callable[[], dict],
                    wait_s: float, poll_s: float = CAPACITY_POLL_S) -> float:
    """Wait up to `wait_s` seconds, with a progress line per poll, until the Ray cluster has a
    slot for every worker (instead of Ray Train waiting forever); returns the seconds waited.
    With `wait_s` 0 (a local Ray) a shortfall fails at once."""
    kind = "GPU" if use_gpu else "CPU"
    start = time.monotonic()
    while (have := int(resources().get(kind, 0))) < cfg.num_workers:
        waited = time.monotonic() - start
        problem = f"--num-workers {cfg.num_workers} needs {cfg.num_workers} {kind}s but the " \
                  f"Ray cluster has {have}"
        if not wait_s:
            raise ConfigError([f"{problem}; lower --num-workers or add nodes"])
        if waited >= wait_s:
            raise JobError(f"{problem} after {waited:.0f} s of waiting; see why the workers did "
                           "not join (kubectl -n ray get pods; kubectl -n ray describe pod on a "
                           "Pending one), or lower --num-workers")
        print(f"waiting for workers: {have} of {cfg.num_workers} {kind}s in the Ray cluster "
              f"({waited:.0f} s, at most {wait_s:.0f} s)", flush=True)
        time.sleep(poll_s)
    return time.monotonic() - start


def _run_started_at(job_started: float) -> float:
    """When this run's Ray cluster started (the head's start, see RUN_STARTED_ENV); this job's
    own start when there is no such record (a local run, a cluster not built by this stack)."""
    path = os.environ.get(RUN_STARTED_ENV)
    try:
        return min(float(Path(path).read_text()), job_started) if path else job_started
    except (OSError, ValueError):  # not written (yet): count from the job's start
        return job_started


def _fit(cfg: TrainConfig, storage: Storage, vocab: int | None, use_gpu: bool, datasets,
         clock: dict):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.config import LoggingConfig

    from training.loop import train_func

    trainer = TorchTrainer(
        train_func,
        train_loop_config={"train": cfg.to_dict(), "vocab_size": vocab, **clock},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=use_gpu),
        run_config=RunConfig(name=cfg.name, storage_path=storage.path,
                             storage_filesystem=storage.filesystem,
                             failure_config=FailureConfig(max_failures=cfg.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             logging_config=LoggingConfig(log_level="WARNING")),
        datasets=datasets,
    )
    try:
        return trainer.fit()
    except Exception as e:  # Ray wraps worker errors; surface the root cause in one line
        raise JobError(_root_cause(e)) from None


def _root_cause(e: BaseException) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    ours = [ln for ln in lines if ln.split(":")[0].endswith(("Error", "Exception"))]
    return (ours or lines or [type(e).__name__])[-1]


def _summary(result, storage: Storage, cfg: TrainConfig) -> dict:
    """The run's last metrics, which rank 0 writes to the run directory (Ray's Result keeps only
    checkpointed reports), plus where the latest checkpoint is."""
    from training.device_time import LINK_FIELDS
    from training.engine import Plan
    from training.run_files import RunFiles

    run_dir = f"{storage.path}/{cfg.name}"
    m = RunFiles(storage.filesystem, run_dir).read_json("summary.json") or {}
    return {
        "steps": m.get("step"),
        "first_loss": m.get("first_loss"),
        "last_loss": m.get("loss"),
        "tokens_per_s": m.get("run_tokens_per_s"),
        "mfu": m.get("mfu"),
        "peak_mem_gib": m.get("peak_mem_gib"),
        "world_size": m.get("world_size"),
        "resumed_from_step": m.get("resumed_from_step"),
        "waited_for_workers_s": m.get("waited_for_workers_s"),
        "time_to_first_step_s": m.get("time_to_first_step_s"),
        "checkpoint": storage.display(result.checkpoint.path) if result.checkpoint else None,
        "run_dir": storage.display(run_dir),
        "nccl_transport": m.get("nccl_transport"),
        "efa_preflight": m.get("efa_preflight"),
        **{f.name: m.get(f.name) for f in dataclasses.fields(Plan)},  # what the defaults chose
        **{k: m.get(k) for k in LINK_FIELDS},  # is the link the bottleneck?
    }


def _quiet_local_logs() -> None:
    """Keep Ray's internal warnings out of the user's terminal; errors still show."""
    quiet.install()
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.filterwarnings("ignore")
    for name in ("ray", "ray.train", "ray.data", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
