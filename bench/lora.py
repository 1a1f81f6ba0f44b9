"""`python -m bench.lora`: LoRA against full fine-tuning on one GPU under a memory budget.

Each run builds the job's engine on one rank (`build_engine`, as a worker does), trains `--steps`
optimizer steps on the shipped instruction set (the job's own cache, packing and sampler; the
`bytes` tokenizer, so nothing is downloaded, on the shape's own vocabulary, so memory is the real
model's) and records tokens/s (the steps after the first, which carries compilation), the
measured peak (bench/single.py `device_peak`, as bench/calibrate.py measures it) beside the
planner's estimate for the plan the engine resolved, the first and last losses and whether every
gradient norm was finite. Runs, in this order (the most wanted first, should time run out):
  lora-large   --large-model (7B) with --lora-rank under --memory-budget-gib, at --large-seq-len
  lora         --model with --lora-rank under --memory-budget-gib
  full-budget  --model, full fine-tuning, under --memory-budget-gib: the planner's refusal is
               the row (one GPU cannot hold 16 bytes a parameter under an L4's budget: 1.5B
               needs 24.7 GB before activations)
  full         the same on the whole GPU
  naive-large  the baseline: the lora-large shape as plain PEFT on the whole GPU (Hugging Face
               gradient checkpointing, full logits, sdpa; bench/naive_peft.py), micro-batches of
               --naive-micro-batch, the same rows and per-document attention as ours (so the
               same loss); --naive-causal lets its rows attend across documents
The built-in shapes are random-init: the losses compare how fast each setting fits the data
from the same start, not what a pretrained model reaches.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import sys
import tempfile
import time
from pathlib import Path

from bench.calibrate import estimate_inputs
from bench.command import refuse, start
from bench.single import device_peak, environment, one_rank, write_json
from stack.parse import JOB_DEFAULTS
from training.config import TrainConfig

KIND = "lora"
GIB = 2**30
RUNS = ("lora-large", "lora", "full-budget", "full", "naive-large")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.lora", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b", help="the shape trained both ways")
    ap.add_argument("--large-model", default="qwen2.5-7b", help="the shape trained with LoRA only")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--large-seq-len", type=int, default=512)
    ap.add_argument("--sequences", type=int, default=8, help="sequences per optimizer step")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-4, help="full fine-tuning's peak")
    ap.add_argument("--lora-lr", type=float, default=1e-3, help="LoRA's peak")
    ap.add_argument("--memory-budget-gib", type=float, default=22.0)
    ap.add_argument("--naive-micro-batch", type=int, default=2)
    ap.add_argument("--naive-causal", action="store_true",
                    help="the baseline attends across the packed documents (causal rows, as the "
                         "baseline rows recorded until 2026-12-02 did): another loss than ours")
    ap.add_argument("--attention", choices=("sdpa", "flex_attention"), default=None,
                    help="ours' attention; default: the cluster job's (stack/parse.py "
                         "JOB_DEFAULTS) on a GPU, sdpa on CPU (FlexAttention has no CPU "
                         "backward); the baseline keeps Hugging Face's sdpa")
    ap.add_argument("--runs", default=",".join(RUNS[:4]), help=f"comma-separated, of {RUNS}")
    ap.add_argument("--profile-dir", type=Path, default=None, help="profile one more step of "
                    "each LoRA run there (bench/step_profile.py: trace and breakdown in the row)")
    ap.add_argument("--json-out", type=Path, default=None)
    return ap


def run_config(args: argparse.Namespace, run: str, on_gpu: bool) -> TrainConfig:
    lora, large = run.startswith(("lora", "naive")), run.endswith("-large")
    seq = args.large_seq_len if large else args.seq_len
    attention = "sdpa" if run == "naive-large" or not on_gpu else args.attention
    return TrainConfig(
        model=args.large_model if large else args.model, seq_len=seq, num_workers=1,
        attention=attention or JOB_DEFAULTS["attention"],
        tokens_per_step=args.sequences * seq, steps=args.steps, warmup_steps=2,
        lr=args.lora_lr if lora else args.lr, lora_rank=args.lora_rank if lora else 0,
        lora_alpha=2.0 * args.lora_rank, tokenizer="bytes",
        memory_budget_gib=None if run in ("full", "naive-large") else args.memory_budget_gib
    ).validated()


def _samples(seq_len: int, directory: str):
    """The shipped set, tokenized by the job's cache into `directory`."""
    import pyarrow.fs as pafs

    from training.data.cache import TokenCache
    from training.data.packing import Samples
    from training.data.source import Source
    from training.data.synthetic import SHIPPED
    from training.data.tokenize import ByteEncoder

    fs = pafs.LocalFileSystem()
    TokenCache(fs, directory, "completion").build(Source.open(str(SHIPPED)), ByteEncoder(),
                                                  seq_len, "completion")
    return Samples(fs, directory)


def _train(engine, cfg: TrainConfig, samples, profile: Path | None = None) -> dict:
    """The run's steps: losses, gradient norms finite, tokens/s after the first step; with
    `profile`, one more step under the torch profiler, its trace written there and its
    breakdown (bench/step_profile.py) in the row."""
    from training.step.engine import mean_across_ranks, train_step
    from training.step.schedule import Schedule

    plan, schedule = engine.plan, Schedule.from_config(cfg)
    losses, finite, seen, started = [], True, 0, time.perf_counter()

    def batches() -> list:
        nonlocal seen
        seen += plan.micro_batch_size * plan.grad_accum
        return [samples.batch(seen, rank=0, world=1, micro=m, batch=plan.micro_batch_size)
                for m in range(plan.grad_accum)]

    for step in range(1, cfg.steps + 1):
        losses.append(mean_across_ranks(train_step(engine, batches(), schedule.lr(step),
                                                   cfg.grad_clip)))  # syncs the device
        finite = finite and math.isfinite(float(engine.grad_norm))
        if step == 1:
            started = time.perf_counter()
    tokens = (cfg.steps - 1) * plan.micro_batch_size * plan.grad_accum * cfg.sample_tokens
    out = {"tokens_per_s": tokens / (time.perf_counter() - started), "losses": losses,
           "first_loss": losses[0], "last_loss": sum(losses[-3:]) / len(losses[-3:]),
           "grad_norms_finite": finite}
    if profile:
        from bench.step_profile import profile_steps

        name = f"{cfg.model}-seq{cfg.seq_len}-mb{plan.micro_batch_size}.json.gz"
        out["profile"] = profile_steps(
            lambda micro: train_step(engine, micro, schedule.lr(cfg.steps), cfg.grad_clip),
            [batches()], engine.device, profile / name)
    return out


def measure_run(cfg: TrainConfig, samples, device, setup=None, profile: Path | None = None
                ) -> dict:
    """One run's row; an error (the planner's refusal, an OOM) is the row's `error_text`.
    `setup(engine)`, when given, prepares the built engine and returns the samples to train on
    (bench/dpo.py: the DPO objective and its reference); `profile`: `_train`'s."""
    import torch

    from training.model.model import model_config
    from training.step.engine import build_engine
    from training.step.memory import estimate_from

    row: dict = {"model": cfg.model, "lora_rank": cfg.lora_rank, "lr": cfg.lr,
                 "memory_budget_gib": cfg.memory_budget_gib, "seq_len": cfg.seq_len,
                 "tokens_per_step": cfg.tokens_per_step, "attention": cfg.attention}
    try:
        if device.type == "cuda":
            if cfg.memory_budget_gib is None:  # an earlier run's budget stays in the allocator
                torch.cuda.set_per_process_memory_fraction(1.0, device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        engine = build_engine(cfg, model_config(cfg.model), device)
        row.update(_train(engine, cfg, setup(engine) if setup else samples, profile))
        inputs = estimate_inputs(engine, cfg)
        row.update(plan=dataclasses.asdict(engine.plan), num_params=engine.num_params,
                   trainable_params=engine.trainable_params, inputs=inputs,
                   estimated_peak_gib=estimate_from(inputs) / GIB, **device_peak(device))
        if row.get("peak_gib"):
            row["estimate_error"] = row["estimated_peak_gib"] / row["peak_gib"] - 1
        del engine
    except Exception as e:  # a refusal or an OOM is a result row, not a lost run
        row["error_text"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
    gc.collect()
    return row


def measure_naive(cfg: TrainConfig, samples, device, micro_batch: int,
                  causal: bool = False) -> dict:
    """The naive PEFT baseline's row (bench/naive_peft.py) on the whole GPU; `causal`: its
    rows attend across their documents."""
    import torch

    from bench import naive_peft

    row: dict = {"model": cfg.model, "lora_rank": cfg.lora_rank, "lr": cfg.lr,
                 "memory_budget_gib": None, "seq_len": cfg.seq_len,
                 "tokens_per_step": cfg.tokens_per_step}
    try:
        if device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0, device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        row.update(naive_peft.train(cfg, samples, device, micro_batch, causal),
                   **device_peak(device))
    except Exception as e:  # an OOM is a result row
        row["error_text"] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300]}"
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def run_all(args: argparse.Namespace, argv: list[str], kind: str, known: tuple[str, ...],
            measure) -> int:
    """Each of --runs on one rank, a row each, the JSON rewritten after every run (a later OOM
    keeps the earlier rows): bench.lora's loop, and bench.dpo's. `measure(run, folder, device)`
    -> the row's measurements; `folder`: a temporary directory for the run's data."""
    runs = [r for r in args.runs.split(",") if r]
    if not runs or not set(runs) <= set(known):
        return refuse(f"--runs takes {', '.join(known)}")
    with one_rank() as device, tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as d:
        result = {"kind": kind, "env": environment(device, argv, f"bench.{kind}"), "rows": [],
                  "settings": {k: str(v) if isinstance(v, Path) else v
                                for k, v in vars(args).items() if k != "json_out"}}
        for run in runs:
            row = {"run": run, **measure(run, d, device)}
            result["rows"].append(row)
            shown = ("run", "model", "tokens_per_s", "peak_gib", "estimated_peak_gib",
                     "first_loss", "last_loss", "error_text")
            print({k: row.get(k) for k in shown}, flush=True)
            write_json(result, args.json_out)
    return 0


def main(argv: list[str] | None = None) -> int:
    args, argv = start(build_parser(), argv)
    data: dict[int, object] = {}  # the shipped set tokenized once per sequence length

    def measure(run: str, d: str, device) -> dict:
        cfg = run_config(args, run, device.type == "cuda")
        if cfg.seq_len not in data:
            data[cfg.seq_len] = _samples(cfg.seq_len, f"{d}/seq{cfg.seq_len}")
        if run == "naive-large":
            return measure_naive(cfg, data[cfg.seq_len], device, args.naive_micro_batch,
                                 args.naive_causal)
        return measure_run(cfg, data[cfg.seq_len], device, profile=args.profile_dir)

    return run_all(args, argv, KIND, RUNS, measure)


if __name__ == "__main__":
    sys.exit(main())
