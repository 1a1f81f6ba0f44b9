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

from training.driver import quiet
from training.head import cold_start, scaleup
from training.config import LOCAL_DEFAULTS, RANDOM_DATA, RUN_STARTED_ENV, ConfigError, TrainConfig
from training.data import DataError
from training.data.prepare import DataPlan, describe, tokenizer_name
from training.data.synthetic import SHIPPED
from training.data.tokenize import BYTES, encoder
from training.flags import add_config_flags
from training.model.loading import local_dir
from training.model.model import ModelError, is_builtin, max_positions, model_config
from training.driver.ray_setup import init_ray
from training.storage import Storage, StorageError, check_writable, resolve, s3_env

EXIT_FAILED, EXIT_BAD_INPUT = 1, 2
DEMO_DEFAULTS = {"data": str(SHIPPED), "tokenizer": BYTES, "name": "demo", "log_every": 1,
                 "lr": 3e-3, "eval_fraction": 0.05, "eval_every": 5}
"""What `--demo` (`make demo`) adds to `--local`: the shipped instruction set with the built-in
byte tokenizer, 5% held out, so the training and evaluation losses visibly fall within seconds."""
# On a cluster (--address) workers may still be joining when the job starts: KubeRay submits once
# every pod runs, a raylet registers moments later, a restarted worker pod takes minutes. A local
# Ray never grows, so there the check fails at once.
CAPACITY_WAIT_S, CAPACITY_POLL_S = 600.0, 10.0
MLFLOW_ENV = "MLFLOW_TRACKING_URI"  # honoured as mlflow's own clients do, unless the flag is given


class JobError(RuntimeError):
    """The training run failed; the message is the root cause."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m training", description=__doc__.split("\n")[0])
    ap.add_argument("--local", action="store_true", help="local Ray, 2 CPU workers, `tiny` model "
                    "(the defaults of a laptop run; other flags still apply)")
    ap.add_argument("--demo", action="store_true", help="--local, trained on the shipped sample "
                    "text with the built-in byte tokenizer, logged and plotted every step")
    add_config_flags(ap)
    return ap


def parse(argv: list[str] | None = None) -> TrainConfig:
    args = vars(build_parser().parse_args(argv))
    local, demo = args.pop("local"), args.pop("demo")
    given = {k: v for k, v in args.items() if v is not None}
    if "mlflow_tracking_uri" not in given and os.environ.get(MLFLOW_ENV):
        given["mlflow_tracking_uri"] = os.environ[MLFLOW_ENV]
    base = {**LOCAL_DEFAULTS, **DEMO_DEFAULTS} if demo else dict(LOCAL_DEFAULTS) if local else {}
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
    plan = DataPlan.for_run(cfg, storage)
    _check_resume(cfg, storage, plan.fingerprint if plan else cfg.data)
    # Tokenized here, before Ray starts: a bad row or token id costs no cluster time.
    tokens = plan.build(model_config(cfg.model, vocab).vocab_size) if plan else None
    print(tokens["summary"] if tokens else describe(cfg, None, None), flush=True)
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        init_ray(cfg.address)
    try:
        use_gpu = cfg.use_gpu if cfg.use_gpu is not None else ray.cluster_resources().get("GPU", 0) > 0
        _check_capacity(cfg, use_gpu, ray.cluster_resources, CAPACITY_WAIT_S if cfg.address else 0.0)
        joined = time.time()
        observed = cold_start.observe_here()  # Kubernetes' side of the start, while it is fresh
        cold_start.summarize(observed, {"job_started": job_started, "workers_joined": joined},
                             title="cold start until the workers joined")  # the rest at the end
        run_started = _run_started_at(job_started)
        # From the run's start (node boot and image pull included) until every worker is there.
        clock = {"run_started_at": run_started, "waited_for_workers_s": time.time() - run_started}
        result = _fit(cfg, storage, vocab, use_gpu, tokens, clock)
    finally:
        if started_here:
            ray.shutdown()
    summary = _summary(result, storage, cfg, tokens["data_format"] if tokens else cfg.data)
    summary["cold_start"] = cold_start.summarize(observed, {
        "job_started": job_started, "workers_joined": joined, **(summary["cold_start"] or {})})
    if summary["stopped"]:
        raise JobError(summary["stopped"])
    return summary


def _check_model_and_data(cfg: TrainConfig) -> int | None:
    """Fail before Ray starts: model reachable, tokenizer for text, seq_len within positions."""
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
    _check_memory_budget(cfg, config)
    return vocab


def _check_memory_budget(cfg: TrainConfig, config) -> None:
    """A micro-batch that cannot fit --memory-budget-gib even with activation checkpointing is
    refused here, not met as a CUDA out-of-memory error inside a worker."""
    if cfg.memory_budget_gib is None:
        return
    import torch
    from transformers import AutoModelForCausalLM

    from training.step.memory import Footprint, cannot_fit, plan_batch
    from training.model.model import count_params

    with torch.device("meta"):
        num_params = count_params(AutoModelForCausalLM.from_config(config))
    # Plain FSDP unless --hsdp-replicas says otherwise: the driver does not know the nodes yet;
    # each worker checks again with the mesh it builds (engine.resolve_plan).
    shard = max(1, cfg.num_workers // (cfg.hsdp_replicas or 1))
    fp = Footprint(config, num_params, shard, int(cfg.memory_budget_gib * 2**30),
                   compiled=cfg.compile is not False, world=cfg.num_workers)  # a budget: GPUs
    micro, accum = plan_batch(cfg, fp, cfg.num_workers)  # the smallest plan when nothing fits
    if (why := cannot_fit(fp, cfg, micro_batch=micro, grad_accum=accum)):
        raise ConfigError([f"{why} (--memory-budget-gib {cfg.memory_budget_gib})"])


def _data_exists(uri: str) -> bool:
    return "://" in uri or Path(uri).exists()


def _tokenizer_vocab(name: str) -> int:
    try:
        return encoder(name).vocab_size()
    except (OSError, ValueError) as e:
        raise ModelError(f"--tokenizer {name!r}: cannot load it ({str(e).splitlines()[0]})") from None


def _check_resume(cfg: TrainConfig, storage: Storage, data_id: str) -> None:
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
        why = scaleup.cause_here()  # on EKS: why cluster-autoscaler brings no node
        print(f"waiting for workers: {have} of {cfg.num_workers} {kind}s in the Ray cluster "
              f"({waited:.0f} s, at most {wait_s:.0f} s)" + (f"; {why.line()}" if why else ""),
              flush=True)
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


def _fit(cfg: TrainConfig, storage: Storage, vocab: int | None, use_gpu: bool,
         tokens: dict | None, clock: dict):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.config import LoggingConfig

    from training.run.loop import train_func

    trainer = TorchTrainer(
        train_func,
        train_loop_config={"train": cfg.to_dict(), "vocab_size": vocab, "tokens": tokens,
                           **clock},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=use_gpu),
        run_config=RunConfig(name=cfg.name, storage_path=storage.path,
                             storage_filesystem=storage.filesystem,
                             failure_config=FailureConfig(max_failures=cfg.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             # --model s3://...: workers read it as the driver does
                             worker_runtime_env={"env_vars": s3_env()} if s3_env() else None,
                             logging_config=LoggingConfig(log_level="WARNING")),
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


def _summary(result, storage: Storage, cfg: TrainConfig, data_format: str) -> dict:
    """The run's last metrics, which rank 0 writes to the run directory (Ray's Result keeps only
    checkpointed reports), plus the newest complete checkpoint and its size."""
    from training.run.checkpoint import latest
    from training.network.device_time import LINK_FIELDS
    from training.step.engine import Plan
    from training.run.run_files import RunFiles

    run_dir = storage.run_dir(cfg.name)
    m = RunFiles(storage.filesystem, run_dir).read_json("summary.json") or {}
    ckpt = latest(storage.filesystem, run_dir, result.checkpoint)
    return {
        "steps": m.get("step"),
        "first_loss": m.get("first_loss"),  # the run's first step, across resumes
        "last_loss": m.get("loss"),
        "data_format": data_format,  # text, prompt-completion, messages, or random/repeat
        "first_eval_loss": m.get("first_eval_loss"),  # before the first step
        "eval_loss": m.get("eval_loss"),  # the last evaluation's
        "tokens_per_s": m.get("run_tokens_per_s"),  # steps only (first step and saves left out)
        "tokens_per_s_with_checkpoints": m.get("run_tokens_per_s_with_checkpoints"),
        "mfu": m.get("mfu"),
        "peak_mem_gib": m.get("peak_mem_gib"),
        "world_size": m.get("world_size"),
        "resumed_from_step": m.get("resumed_from_step"),
        "waited_for_workers_s": m.get("waited_for_workers_s"),
        "time_to_first_step_s": m.get("time_to_first_step_s"),
        "cold_start": m.get("cold_start_marks"),  # the loop's milestones; run() makes the phases
        "checkpoint": storage.display(ckpt.path) if ckpt else None,
        "checkpoint_gib": _size_gib(storage.filesystem, ckpt.path) if ckpt else None,
        "run_dir": storage.display(run_dir),
        "nccl_transport": m.get("nccl_transport"),
        "efa_preflight": m.get("efa_preflight"),
        "stopped": m.get("stopped"),  # why the run ended early (a non-finite loss), if it did
        "export_path": m.get("export_path"),  # the Hugging Face model directory, when exported
        "mlflow_run_id": m.get("mlflow_run_id"),
        "mlflow_error": m.get("mlflow_error"),  # why tracking stopped (training went on)
        "load_s": m.get("load_s"),  # pretrained weights: read on rank 0, broadcast, sharded
        "load_host_rss_gib": m.get("load_host_rss_gib"),  # peak host RSS per rank after it
        **{f.name: m.get(f.name) for f in dataclasses.fields(Plan)},  # what the defaults chose
        **{k: m.get(k) for k in LINK_FIELDS},  # is the link the bottleneck?
    }


def _size_gib(fs, path: str) -> float:
    from pyarrow.fs import FileSelector

    return sum(i.size or 0 for i in fs.get_file_info(FileSelector(path, recursive=True))) / 2**30


def _quiet_local_logs() -> None:
    """Keep Ray's internal warnings out of the user's terminal; errors still show."""
    quiet.install()
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.filterwarnings("ignore")
    for name in ("ray", "ray.train", "ray.data", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
