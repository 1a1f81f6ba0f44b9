"""`python -m training`: the RayJob entrypoint and the local main job.

Parses and validates the flags, checks everything that can be checked before a worker starts
(model, tokenizer, sequence length, data, storage, cluster capacity), runs the TorchTrainer, and
prints one JSON summary as the last stdout line. Any failure is one `error:` line and a non-zero
exit.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable

# Only what parsing needs at import time: `python -m training --help` answers without torch,
# transformers or Ray (10-28 s of imports); each step of `run` imports its own layer.
from training.config import RANDOM_DATA, ConfigError, TrainConfig, exclusive
from training.pod_contract import CODE_DIGEST_ENV, RUN_STARTED_ENV
from training.data.synthetic import PAIRS, SHIPPED
from training.data.tokenize import BYTES
from training import run_names
from training.driver import quiet
from training.errors import InputError
from training.flags import add_config_flags

if TYPE_CHECKING:
    from training.run.handoff import RunPlan, RunSummary, WorkerInputs
    from training.storage import Storage

EXIT_FAILED, EXIT_BAD_INPUT = 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a job stopped by Ctrl-C
LOCAL_DEFAULTS = {"model": "tiny", "num_workers": 2, "use_gpu": False, "address": None}
"""What `--local` means: a local Ray with two CPU workers training the `tiny` shape."""
DEMO_DEFAULTS = {"data": str(SHIPPED), "tokenizer": BYTES, "log_every": 1,
                 "lr": 3e-3, "eval_fraction": 0.05, "eval_every": 5, "export": True}
"""What `--demo` (`make demo`) adds to `--local`: the shipped instruction set with the built-in
byte tokenizer, 5% held out, so the training and evaluation losses visibly fall within seconds,
and exported at the end (`outputs/demo/hf_model`, the model
docs/using-the-model.md loads)."""
DEMO_NAME = "demo"
"""The run --demo's own settings define; a --demo with another model, data, sequence length,
LoRA or objective is `demo-<key>` (training/run_names.py), a run of its own."""
# On a cluster (--address) workers may still be joining when the job starts: KubeRay submits once
# every pod runs, a raylet registers moments later, a restarted worker pod takes minutes. A local
# Ray never grows, so there the check fails at once.
CAPACITY_WAIT_S, CAPACITY_POLL_S = 600.0, 10.0
MLFLOW_ENV = "MLFLOW_TRACKING_URI"  # honoured as mlflow's own clients do, unless the flag is given


class JobError(RuntimeError):
    """The training run failed; the message is the root cause."""


class _Parser(argparse.ArgumentParser):
    """An argparse error is its one line and where the flags are listed: the default prints the
    whole usage (50 lines of flags) before it."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"error: {message} (`{self.prog} --help` lists every flag)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m training", description=__doc__.split("\n")[0],
                 epilog=demo_epilog())
    ap.add_argument("--local", action="store_true", help="local Ray, 2 CPU workers, `tiny` model "
                    "(the defaults of a laptop run; other flags still apply)")
    ap.add_argument("--demo", action="store_true", help="--local, trained on the shipped sample "
                    "text with the built-in byte tokenizer, logged and plotted every step; "
                    f"named `{DEMO_NAME}` (with another model, data, sequence length, LoRA or "
                    f"objective: `{DEMO_NAME}-<key>`)")
    ap.add_argument("--preview", type=int, metavar="N", help="print the first N training rows "
                    "of --data as JSON lines {\"text\": the rendered row, \"trained\": [each "
                    "span the loss trains on]} and exit, before any storage or Ray")
    add_config_flags(ap)
    return ap


def demo_epilog() -> str:
    """--help's defaults are a cluster run's; this names what --local and --demo change."""
    return ("--local changes these defaults: " + _flags(LOCAL_DEFAULTS) + "; --demo also: " +
            _flags(DEMO_DEFAULTS) + f", and names the run {DEMO_NAME} ({DEMO_NAME}-<key> with "
            "another model, data, --seq-len, LoRA or objective)")


def _flags(values: dict) -> str:
    def one(key: str, value) -> str:
        flag = key.replace("_", "-")
        if isinstance(value, bool):
            return f"--{flag}" if value else f"--no-{flag}"
        return f"no --{flag}" if value is None else f"--{flag} {value}"
    return ", ".join(one(k, v) for k, v in values.items())


def parse(argv: list[str] | None = None) -> TrainConfig:
    return parse_args(argv)[0]


def parse_args(argv: list[str] | None = None) -> tuple[TrainConfig, int | None]:
    """The validated settings, and --preview's row count (None: train)."""
    args = vars(build_parser().parse_args(argv))
    local, demo, preview = args.pop("local"), args.pop("demo"), args.pop("preview")
    given = {k: v for k, v in args.items() if v is not None}
    if "mlflow_tracking_uri" not in given and os.environ.get(MLFLOW_ENV):
        given["mlflow_tracking_uri"] = os.environ[MLFLOW_ENV]
    base = {**LOCAL_DEFAULTS, **DEMO_DEFAULTS} if demo else dict(LOCAL_DEFAULTS) if local else {}
    if demo and given.get("objective") == "dpo":  # the shipped pairs (training/data/synthetic.py)
        base["data"] = str(PAIRS)
    if demo and "name" not in given:
        given["name"] = run_names.named_after(TrainConfig(**{**base, **given}), DEMO_NAME,
                                              TrainConfig(**base))
    cfg = TrainConfig(**{**base, **given})
    if preview is not None and (preview < 1 or cfg.data in RANDOM_DATA):
        raise ConfigError([f"--preview needs a count of at least 1 and --data files (got "
                           f"--preview {preview}, --data {cfg.data})"])
    if problems := cfg.problems() + exclusive(given):
        raise ConfigError(problems)
    return cfg, preview


def main(argv: list[str] | None = None) -> int:
    _quiet_local_logs()
    try:
        cfg, preview = parse_args(argv)
        if preview is not None:
            return show_preview(cfg, preview)
        summary = run(cfg)
    except InputError as e:  # every bad input: settings, data, model, storage
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except JobError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"interrupted: {_interrupted_note(argv)}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    print(summary.to_json(), flush=True)
    return 0


def _interrupted_note(argv: list[str] | None) -> str:
    """What a Ctrl-C left behind: the run's newest complete checkpoint (the same command resumes
    from it, training/run/checkpoint.py `latest`), or that nothing was saved."""
    try:
        from training.run.checkpoint import latest
        from training.storage import resolve

        cfg = parse(argv)
        storage = resolve(cfg.storage_path)
        ckpt = latest(storage.filesystem, storage.run_dir(cfg.name), None)
    except Exception:  # noqa: BLE001 - interrupted before the settings or storage were known
        return "nothing was saved"
    if ckpt is None:
        return f"run {cfg.name!r} has no checkpoint yet; rerun the same command to start it again"
    step = int(Path(ckpt.path).name.removeprefix("checkpoint-step"))
    return (f"run {cfg.name!r} is saved at step {step} ({storage.display(ckpt.path)}); "
            "rerun the same command to resume from there")


def show_preview(cfg: TrainConfig, count: int) -> int:
    """--preview: the rows as JSON lines on stdout; nothing else runs."""
    import json

    from training.driver import early

    early.check(cfg)  # before torch, transformers and Ray are imported
    from training.data.preview import preview
    from training.driver import checks

    cfg = checks.absolute_paths(cfg)
    for row in preview(cfg, checks.check_data_and_tokenizer(cfg), count):
        print(json.dumps(row, ensure_ascii=False), flush=True)
    return 0


def run(cfg: TrainConfig) -> RunSummary:
    """The run, from its plan to its summary. A run refused before its first step (bad input
    anywhere until Ray Train starts the workers) leaves no run directory behind."""
    from training.driver import early
    from training.storage import removed_on_refusal, resolve

    early.check(cfg)  # before torch, transformers and Ray are imported
    storage = resolve(cfg.storage_path)
    with removed_on_refusal(storage, cfg.name):
        return _run(cfg, storage)


def _run(cfg: TrainConfig, storage: Storage) -> RunSummary:
    from training.driver import checks, placement, ray_setup, run_record
    from training.driver import plan as run_plan
    from training.head import cold_start, node_watch
    from training.run.handoff import WorkerInputs

    job_started = time.time()
    plan, storage = run_plan.build(cfg, storage)  # every check before Ray, in one pass
    cfg, resume = plan.cfg, plan.resume
    done = checks.finished(cfg, storage)
    if done is not None and not _export_only(done, cfg, storage):
        return _summary(None, storage, plan)
    if resume and not done:
        print(f"resuming run {cfg.name!r} from {resume.checkpoint} (step {resume.step})",
              flush=True)
        for note in resume.notes:
            print(f"WARNING: {note}", file=sys.stderr)
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        ray_setup.init_ray(cfg.address)
    try:
        use_gpu = cfg.use_gpu if cfg.use_gpu is not None else ray.cluster_resources().get("GPU", 0) > 0
        _check_capacity(cfg, use_gpu, ray.cluster_resources, CAPACITY_WAIT_S if cfg.address else 0.0)
        joined = time.time()
        observed = cold_start.observe_here()  # Kubernetes' side of the start, while it is fresh
        cold_start.summarize(observed, {"job_started": job_started, "workers_joined": joined},
                             title="cold start until the workers joined")  # the rest at the end
        # Before Ray Train starts a worker: the step planned on the mesh the workers will form.
        plan = run_plan.place(plan, placement.cluster_worker_nodes(use_gpu, cfg.num_workers),
                              placement.gpu_memory_bytes() if use_gpu else None)
        run_started = _run_started_at(job_started)
        # From the run's start (node boot and image pull included) until every worker is there.
        inputs = WorkerInputs(plan, run_started_at=run_started,
                              waited_for_workers_s=time.time() - run_started)
        run_record.record(cfg, storage)  # nothing refused it: the settings its checkpoints keep
        # Each node event classified at its notice, while its Node still says why.
        with node_watch.watching(storage.filesystem, storage.run_dir(cfg.name)):
            result = _fit(inputs, storage, use_gpu)
    finally:
        if started_here:
            ray.shutdown()
    summary = _summary(result, storage, plan, None if done else lambda marks: (
        cold_start.summarize(observed, {"job_started": job_started, "workers_joined": joined,
                                        **marks})))
    if summary.stopped:
        raise JobError(summary.stopped)
    return summary


def _export_only(done: RunSummary, cfg: TrainConfig, storage: Storage) -> bool:
    """A finished run: say so; True when --export asks for the export it lacks, which the
    workers then write from its last checkpoint without a step (trainer.py `finish`)."""
    where = storage.display(storage.run_dir(cfg.name))
    if cfg.export and not done.export_path:
        print(f"run {cfg.name!r} finished at step {done.steps} already ({where}): exporting its "
              "last checkpoint, no training", flush=True)
        return True
    print(f"run {cfg.name!r} finished at step {done.steps} of {cfg.steps} already ({where}): "
          "nothing to train, its results are left as they are; raise --steps to continue it, "
          + ("" if done.export_path else "--export to export it, ") + "or give a new --name",
          flush=True)
    return False


def _check_capacity(cfg: TrainConfig, use_gpu: bool, resources: Callable[[], dict],
                    wait_s: float, poll_s: float = CAPACITY_POLL_S) -> float:
    """Wait up to `wait_s` seconds, with a progress line per poll, until the Ray cluster has a
    slot for every worker (instead of Ray Train waiting forever); returns the seconds waited.
    With `wait_s` 0 (a local Ray) a shortfall fails at once."""
    from training.head import scaleup

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


def _fit(inputs: WorkerInputs, storage: Storage, use_gpu: bool):
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.api.config import LoggingConfig

    from training.driver import ray_setup
    from training.run.loop import train_func
    from training.storage import s3_env

    cfg = inputs.plan.cfg
    trainer = ray_setup.interruptible_trainer()(
        train_func,
        train_loop_config=inputs.as_loop_config(),
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=use_gpu),
        run_config=RunConfig(name=cfg.name, storage_path=storage.path,
                             storage_filesystem=storage.filesystem,
                             failure_config=FailureConfig(
                                 max_failures=cfg.max_failures,
                                 max_preemption_failures=cfg.max_preemptions),
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             # --model s3://...: workers read it as the driver does
                             worker_runtime_env={"env_vars": s3_env()} if s3_env() else None,
                             logging_config=LoggingConfig(log_level="WARNING")),
    )
    try:
        result = trainer.fit()
    except (Exception, SystemExit) as e:  # Ray wraps worker errors; the root cause in one line
        if trainer.interrupted:
            raise KeyboardInterrupt from None
        raise JobError(_root_cause(e)) from None
    if trainer.interrupted:
        raise KeyboardInterrupt
    return result


def _root_cause(e: BaseException) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    ours = [ln for ln in lines if ln.split(":")[0].endswith(("Error", "Exception"))]
    return (ours or lines or [type(e).__name__])[-1]


def _summary(result, storage: Storage, plan: RunPlan,
             phases: Callable[[dict], dict | None] | None = None) -> RunSummary:
    """The run's summary, completed here once: what rank 0 wrote to the run directory (Ray's
    Result keeps only checkpointed reports; `result` None: no run now) with the data format, the
    newest complete checkpoint and its size, the code's digest, and (`phases`, a run now) the
    cold start's phases from the loop's milestones."""
    import dataclasses

    from training.driver.checks import saved_summary
    from training.evals import cost as harness_cost
    from training.head import node_events
    from training.run.checkpoint import latest
    from training.run.handoff import SUMMARY_FILE, RunSummary
    from training.run.run_files import RunFiles

    cfg = plan.cfg
    run_dir = storage.run_dir(cfg.name)
    ckpt = latest(storage.filesystem, run_dir, result.checkpoint if result else None)
    saved = saved_summary(cfg, storage) or RunSummary()
    summary = dataclasses.replace(
        saved, data_format=plan.data.data_format if plan.data else cfg.data,
        data_rows=plan.data.rows if plan.data else None,
        checkpoint=storage.display(ckpt.path) if ckpt else None,
        checkpoint_gib=_size_gib(storage.filesystem, ckpt.path) if ckpt else None,
        run_dir=storage.display(run_dir),
        cold_start=phases(saved.cold_start or {}) if phases else saved.cold_start,
        harness_gpu_node_usd=harness_cost.summary_usd(saved),  # the price is the head's
        node_events=node_events.read_all(storage.filesystem, run_dir) or None,
        # This job's code when it ran now; the one that wrote the summary otherwise.
        code_digest=os.environ.get(CODE_DIGEST_ENV) if result is not None else saved.code_digest)
    if result is not None:  # one summary: summary.json holds what the last line prints
        RunFiles(storage.filesystem, run_dir).write_json(SUMMARY_FILE, summary.to_dict())
    return summary


def _size_gib(fs, path: str) -> float:
    from pyarrow.fs import FileSelector

    return sum(i.size or 0 for i in fs.get_file_info(FileSelector(path, recursive=True))) / 2**30


def _quiet_local_logs() -> None:
    """Keep Ray's internal warnings out of the user's terminal; errors still show."""
    quiet.install()
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # huggingface_hub's download bars and transformers' loading bars (transformers.utils.logging
    # follows huggingface_hub's are_progress_bars_disabled), in the driver and its local workers.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    warnings.filterwarnings("ignore")
    for name in ("ray", "ray.train", "ray.data", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)
