"""`python -m bench`: our training step against the reference approach, side by side.

One invocation, through Ray Train with one worker per visible GPU, measures
  - the GPU's bf16 matmul rate (`mfu_measured_matmul` is against it; `mfu`, as in the job,
    against the datasheet peak),
  - `reference`: what the AWS sample does (FSDP1 via `prepare_model` with a size-based wrap policy
    at 1e7 parameters, model in bf16, plain AdamW, Hugging Face's loss; with --grad-accum it
    accumulates as plain PyTorch does, reducing gradients on every micro-batch),
  - `reference-no-sync`: the same, accumulating under FSDP1's `no_sync()` (once per step),
  - `ours`: the real step of `training/` (`engine.build_engine` + `engine.train_step`), and any
    lever variants named with --variants (the steps themselves: bench/steps.py),
on the same micro-batches and tokens per optimizer step, warm-up excluded, timed with CUDA events.
For the step-time model (`python -m bench.step_model --check`) each row also records the warm-up
bandwidth probe of the variant's groups and, for ours, the compute time of one micro-batch with no
communication at all. It prints a table and writes a JSON result; bench/RESULTS.md is rendered from
the JSON results in bench/runs/ (`python -m bench.results`), so CPU rehearsals never reach it.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.command import refuse, start
from bench.report import table
from training.config import TrainConfig
from training.flags import add_config_flags

# The job settings the benchmark takes as flags; every variant starts from them.
BENCH_SETTINGS = ("model", "seq_len", "micro_batch_size", "grad_accum", "memory_budget_gib")

# `ours` is the job's defaults (on a GPU with room to spare: compiled layers and loss, ZeRO-2); each
# variant takes levers out of them through TrainConfig overrides, so a row isolates that change.
# Through 2026-11-29 the defaults were eager and ZeRO-3: that is `ours-eager-zero3` now.
VARIANTS: dict[str, dict] = {
    "ours": {},
    "ours-eager": {"compile": False},
    "ours-zero3": {"reshard_after_forward": True},
    "ours-eager-zero3": {"compile": False, "reshard_after_forward": True},
    "ours-unfused-loss": {"loss_chunk_tokens": 0},
    "ours-ac": {"activation_checkpointing": True},
    # Levers for a network-bound step, added to the defaults one at a time.
    "ours-bf16-reduce": {"reduce_dtype": "bf16"},
    "ours-hsdp": {"hsdp_replicas": 2},
    "ours-hsdp-bf16-reduce": {"hsdp_replicas": 2, "reduce_dtype": "bf16"},
    "ours-bf16-reduce-prefetch2": {"reduce_dtype": "bf16", "prefetch_layers": 2},
    # Packed rows of 4 documents with per-document positions (attention masked
    # block-diagonally), against `ours` (one causal mask over the row): sdpa with a dense mask,
    # flex_attention with a block-sparse one, and flex_attention on causal rows.
    "ours-docs4": {},
    "ours-docs4-flex": {"attention": "flex_attention"},
    "ours-flex": {"attention": "flex_attention"},
    # Liger-Kernel's fused Triton RMSNorm, SwiGLU MLP and rotary embedding in place of
    # transformers' Qwen2 modules (bench/steps.py liger_kernels), on compiled layers and eager:
    # what fused kernels give over compile's own fusion.
    "ours-liger": {},
    "ours-liger-eager": {"compile": False},
}
LIGER = ("ours-liger", "ours-liger-eager")
DOCUMENTS_PER_ROW = {"ours-docs4": 4, "ours-docs4-flex": 4}
REFERENCE = "reference"
# The same FSDP1 call, accumulating under FSDP1's `no_sync()`: it too communicates once per
# optimizer step, the strongest plain-PyTorch reference (vs_reference stays against REFERENCE).
REFERENCE_NO_SYNC = "reference-no-sync"
REFERENCES = (REFERENCE, REFERENCE_NO_SYNC)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    # Model, shape and memory flags are the job's own (training/config.py), with bench defaults.
    add_config_flags(ap, BENCH_SETTINGS)
    ap.set_defaults(model="qwen2.5-1.5b", seq_len=2048, micro_batch_size=4, grad_accum=1)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per variant")
    ap.add_argument("--variants", default="reference,ours",
                    help=f"comma-separated: {', '.join(REFERENCES)}, {', '.join(VARIANTS)}")
    ap.add_argument("--num-workers", type=int, default=None, help="default: one per visible GPU, "
                    "2 on CPU")
    ap.add_argument("--label", default="", help="free text for the results row (e.g. the lever)")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/bench-runs"),
                    help="Ray Train's scratch storage for the run")
    ap.add_argument("--profile-dir", type=Path, default=None, help="after timing, profile 2 more "
                    "steps of each variant on rank 0: a gzipped Chrome trace per variant here (on "
                    "rank 0's node) and a breakdown of the step's device time in the JSON and table")
    return ap


def _profile(step, batches, device, rank: int, trace_path: Path) -> dict | None:
    """Profile on rank 0 only; the other ranks run the same steps to keep the collectives paired."""
    from bench.step_profile import profile_steps

    if rank == 0:
        return profile_steps(step, batches, device, trace_path)
    for micro in batches:
        step(micro)
    return None


@dataclasses.dataclass(frozen=True)
class BenchOptions:
    """What the driver hands every worker (through Ray's `train_loop_config`)."""
    model: str
    seq_len: int
    micro_batch_size: int
    grad_accum: int
    memory_budget_gib: float | None
    steps: int
    warmup: int
    variants: tuple[str, ...]
    profile_dir: str | None  # absolute: the workers' working directory is not the driver's


@dataclasses.dataclass(frozen=True)
class _Worker:
    """One worker's place in the run and the settings every variant starts from."""
    rank: int
    world: int
    device: Any  # torch.device (torch is imported on the workers only)
    base: TrainConfig
    model_cfg: Any  # the model's transformers PretrainedConfig


def bench_func(config: dict) -> None:
    """Per worker: matmul rate, then each variant in turn; rank 0 reports all rows."""
    from bench.timing import matmul_tflops
    from training.run.worker import worker_context
    from training.model.model import model_config
    from training.network import transport
    from training.step.engine import memory_limit_bytes

    opts: BenchOptions = config["options"]
    rank, world, _, device = worker_context()
    link = transport.check_transport(transport.capture_nccl_log(rank), device, "any", "warn")
    base = TrainConfig(model=opts.model, seq_len=opts.seq_len,
                       micro_batch_size=opts.micro_batch_size, grad_accum=opts.grad_accum,
                       num_workers=world, memory_budget_gib=opts.memory_budget_gib)
    memory_limit_bytes(base, device)  # applies the budget to every variant, the reference too
    worker = _Worker(rank, world, device, base, model_config(base.model))
    matmul = matmul_tflops(device)
    batches = _random_batches(worker, opts.warmup + opts.steps)
    rows = [_variant_row(name, worker, batches, opts) for name in opts.variants]
    fpt, n_params = _flops_per_token(worker)
    _add_mfu(rows, fpt, matmul, device)
    _report(rank, {"env": _environment(worker, matmul, fpt, n_params, link.verdict),
                   "rows": rows})


def _random_batches(worker: _Worker, n_steps: int) -> list:
    """`n_steps` optimizer steps of random tokens, each a list of `grad_accum` micro-batches."""
    from training.data.random_tokens import random_batch

    base = worker.base
    return [[tuple(t.to(worker.device) for t in random_batch(
        seed=0, rank=worker.rank, step=s, micro=m, batch=base.micro_batch_size,
        seq_len=base.seq_len, vocab=worker.model_cfg.vocab_size, repeat=False))
        for m in range(base.grad_accum)] for s in range(n_steps)]


def _peak_gib(device) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _variant_row(name: str, worker: _Worker, batches: list, opts: BenchOptions) -> dict:
    """One variant's result row; an OOM or a broken lever is a row with its error, not a lost run.
    Every rank ends the variant at a barrier, so the next one starts together."""
    import torch
    import torch.distributed as dist

    from bench import steps

    cfg = dataclasses.replace(worker.base, **VARIANTS.get(name, {}))
    if worker.device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(worker.device)
    row = {"variant": name}
    docs = DOCUMENTS_PER_ROW.get(name)
    row_batches = steps.with_documents(batches, docs, cfg.seq_len) if docs else batches
    try:
        with steps.liger_kernels(name in LIGER):
            _measure(name, cfg, worker, row_batches, opts, row)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else \
            type(e).__name__
    row.setdefault("peak_mem_gib", _peak_gib(worker.device))
    gc.collect()  # the variant's model and optimizer went with _measure's frame
    dist.barrier()
    return row


def _measure(name: str, cfg: TrainConfig, worker: _Worker, batches: list, opts: BenchOptions,
             row: dict) -> None:
    """Build the variant, time its steps (and profile them with --profile-dir), then for ours
    measure compute alone; fills `row` as it goes, so a failure keeps what was measured."""
    from bench import steps
    from bench.timing import time_steps

    device = worker.device
    step, keep = _build_variant(name, cfg, worker, row)
    times = time_steps(step, batches, opts.warmup, opts.steps, device)
    if opts.profile_dir:
        row["profile"] = _profile(step, batches[:2], device, worker.rank,
                                  Path(opts.profile_dir) / f"{name}.trace.json.gz")
    step_s = statistics.median(times)
    per_worker = cfg.tokens_per_step_per_worker
    row.update(step_time_ms=step_s * 1000, tokens_per_s_per_gpu=per_worker / step_s,
               tokens_per_step=per_worker * worker.world)
    row["peak_mem_gib"] = _peak_gib(device)  # before the compute-only probe below
    if name not in REFERENCES:
        # the same batches and initial weights in every variant: a kernel's numerics show here
        row["losses"] = [float(x) for x in step.losses]
        try:
            row["compute_ms_per_micro_batch"] = 1000 * steps.compute_only_seconds(
                keep, batches[0], device)
        except Exception as e:  # e.g. the unsharded gradients exceed a memory budget
            row["compute_error"] = f"{type(e).__name__}: {str(e)[:200]}"


def _build_variant(name: str, cfg: TrainConfig, worker: _Worker, row: dict):
    """The variant's step function and what it keeps alive; records its plan (ours) and the
    bandwidth probe of the groups it communicates over."""
    from bench import steps
    from training.network.bandwidth import probe

    device = worker.device
    if name in REFERENCES:
        if device.type != "cuda":
            raise RuntimeError("skipped: FSDP1 prepare_model needs a GPU")
        step, keep = steps.reference_step(worker.model_cfg, device,
                                          no_sync=name == REFERENCE_NO_SYNC)
        row["bandwidth"] = steps.probe_reference(device)
    else:
        step, keep = steps.ours_step(cfg, worker.model_cfg, device)
        row.update(dataclasses.asdict(keep.plan))
        row["bandwidth"] = probe(keep.mesh, device)
    return step, keep


def _flops_per_token(worker: _Worker) -> tuple[float, int]:
    """The job's FLOPs accounting, 6N (the input embedding of an untied model left out) +
    attention, and N."""
    import torch

    from training.model.model import build_model, count_params
    from training.step.metrics import model_flops_per_token

    cfg = worker.model_cfg
    with torch.device("meta"):
        n_params = count_params(build_model(worker.base.model, cfg, seed=0))
    return model_flops_per_token(cfg, n_params, worker.base.seq_len), n_params


def _add_mfu(rows: list[dict], fpt: float, matmul: float | None, device) -> None:
    """MFU of each timed row against the datasheet peak (`mfu`) and the measured matmul rate."""
    import torch

    from training.step.metrics import peak_flops

    peak = peak_flops(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    for row in rows:
        if "tokens_per_s_per_gpu" in row:
            row["mfu"] = row["tokens_per_s_per_gpu"] * fpt / peak if peak else None
            row["mfu_measured_matmul"] = (row["tokens_per_s_per_gpu"] * fpt / (matmul * 1e12)
                                          if matmul else None)


def _environment(worker: _Worker, matmul: float | None, fpt: float, n_params: int,
                 transport_verdict: str) -> dict:
    import torch

    cuda = worker.device.type == "cuda"
    return {
        "gpu": torch.cuda.get_device_name(worker.device) if cuda else platform.processor()
        or "cpu",
        "world_size": worker.world, "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "matmul_tflops": matmul, "flops_per_token": fpt, "num_params": n_params,
        "nccl_transport": transport_verdict,
        "nccl_env": {k: v for k, v in os.environ.items() if k in ("NCCL_P2P_DISABLE",
                                                                  "NCCL_SHM_DISABLE", "NCCL_NET")},
    }


def _report(rank: int, result: dict) -> None:
    """Ray Train keeps the metrics of checkpointed reports: rank 0 ships the result as one."""
    import tempfile

    import ray.train

    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if rank == 0:
            Path(d, "bench.json").write_text(json.dumps(result))
            checkpoint = ray.train.Checkpoint.from_directory(d)
        ray.train.report({}, checkpoint=checkpoint)


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.config import LoggingConfig

    from training.driver.ray_setup import (local_workers_at_driver_priority, torch_trainer,
                                          worker_env)

    started_here = not ray.is_initialized()
    if started_here:
        local_workers_at_driver_priority()
        ray.init(logging_level="ERROR", runtime_env={"env_vars": worker_env()})
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        workers = args.num_workers or gpus or 2
        opts = BenchOptions(
            model=args.model, seq_len=args.seq_len, micro_batch_size=args.micro_batch_size,
            grad_accum=args.grad_accum, memory_budget_gib=args.memory_budget_gib,
            steps=args.steps, warmup=args.warmup, variants=tuple(args.variants.split(",")),
            profile_dir=str(args.profile_dir.resolve()) if args.profile_dir else None)
        scaling = ScalingConfig(num_workers=workers, use_gpu=gpus > 0)
        trainer = torch_trainer()(bench_func, train_loop_config={"options": opts},
                                  scaling_config=scaling,
                                  run_config=RunConfig(
                                      name="bench", storage_path=str(args.work_dir),
                                      logging_config=LoggingConfig("WARNING")))
        with trainer.fit().checkpoint.as_directory() as d:
            result = json.loads(Path(d, "bench.json").read_text())
    finally:
        if started_here:
            ray.shutdown()
    return _with_provenance(result, args, argv)


def _with_provenance(result: dict, args: argparse.Namespace, argv: list[str]) -> dict:
    """The rows against the reference, and the settings, date and command of the run."""
    ref = next((r for r in result["rows"] if r["variant"] == REFERENCE and "error" not in r), None)
    for row in result["rows"]:
        if ref and "tokens_per_s_per_gpu" in row:
            row["vs_reference"] = row["tokens_per_s_per_gpu"] / ref["tokens_per_s_per_gpu"]
    result["settings"] = {k: v for k, v in vars(args).items()
                          if k not in ("json_out", "work_dir", "profile_dir")}
    result["settings"]["json_out"] = str(args.json_out) if args.json_out else None
    result["env"]["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    result["env"]["command"] = "python -m bench " + shlex.join(argv)
    result["kind"] = "throughput"
    return result


def main(argv: list[str] | None = None) -> int:
    args, argv = start(build_parser(), argv)
    unknown = [v for v in args.variants.split(",") if v not in REFERENCES and v not in VARIANTS]
    if unknown:
        return refuse(f"unknown --variants {unknown}; choose from {[*REFERENCES, *VARIANTS]}")
    result = run(args, argv)
    print(table(result))
    from bench.single import write_json

    write_json(result, args.json_out)
    return 0

