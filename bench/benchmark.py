"""`python -m bench`: our training step against the reference approach, side by side.

One invocation, through Ray Train with one worker per visible GPU, measures
  - the GPU's bf16 matmul rate (`mfu_measured_matmul` is against it; `mfu`, as in the job,
    against the datasheet peak),
  - `reference`: what the AWS sample does (FSDP1 via `prepare_model` with a size-based wrap policy
    at 1e7 parameters, model in bf16, plain AdamW, Hugging Face's loss; with --grad-accum it
    accumulates as plain PyTorch does, reducing gradients on every micro-batch),
  - `reference-no-sync`: the same, accumulating under FSDP1's `no_sync()` (once per step),
  - `ours`: the real step of `training/` (`engine.build_engine` + `engine.train_step`), and any
    lever variants named with --variants,
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
import time
from pathlib import Path

from training.flags import add_config_flags
from training.config import TrainConfig

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
    # Issue 14's levers for a network-bound step, added to the defaults one at a time.
    "ours-bf16-reduce": {"reduce_dtype": "bf16"},
    "ours-hsdp": {"hsdp_replicas": 2},
    "ours-hsdp-bf16-reduce": {"hsdp_replicas": 2, "reduce_dtype": "bf16"},
    "ours-bf16-reduce-prefetch2": {"reduce_dtype": "bf16", "prefetch_layers": 2},
    # Issue 19: packed rows of 4 documents with per-document positions (attention masked
    # block-diagonally), against `ours` (one causal mask over the row): sdpa with a dense mask,
    # flex_attention with a block-sparse one, and flex_attention on causal rows.
    "ours-docs4": {},
    "ours-docs4-flex": {"attention": "flex_attention"},
    "ours-flex": {"attention": "flex_attention"},
}
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


def _back_to_back_seconds(calls, device) -> list[float]:
    """Seconds per call of `calls` (zero-argument functions) run back to back as a training loop
    runs them: no host sync in between, so the CPU queues call i+1 while the GPU runs call i.
    On GPU each call's end is a CUDA event and a call's time is the gap between consecutive ends
    (device-side); on CPU the host clock."""
    import torch

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    marks = []

    def mark():
        if cuda:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        else:
            marks.append(time.perf_counter())

    mark()
    for call in calls:
        call()
        mark()
    if cuda:
        marks[-1].synchronize()
        return [a.elapsed_time(b) / 1000 for a, b in zip(marks, marks[1:])]
    return [b - a for a, b in zip(marks, marks[1:])]


def _time_steps(step, batches, warmup: int, steps: int, device) -> list[float]:
    """Seconds per step for `steps` timed steps after `warmup` untimed ones; a batch is one
    optimizer step's list of micro-batches."""
    for micro in batches[:warmup]:
        step(micro)
    timed = batches[warmup:warmup + steps]
    return _back_to_back_seconds([lambda m=micro: step(m) for micro in timed], device)


def _matmul_tflops(device) -> float | None:
    """Measured dense bf16 matmul rate on random data (8192^3, median of 20)."""
    import torch

    if device.type != "cuda":
        return None
    n = 8192
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(5):
        a @ b
    times = _back_to_back_seconds([lambda: a @ b] * 20, device)
    return 2 * n**3 / statistics.median(times) / 1e12


def _reference_step(model_cfg, device, no_sync: bool = False):
    """The AWS sample's setup: FSDP1 size-based wrap (1e7), bf16 model, plain AdamW, HF loss;
    `no_sync` accumulates all but the last micro-batch inside FSDP1's `no_sync()` (unsharded
    gradients kept, one reduce-scatter per optimizer step: torch/distributed/fsdp/
    fully_sharded_data_parallel.py `no_sync`)."""
    import contextlib
    import functools

    import ray.train.torch
    import torch
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_cfg, attn_implementation="sdpa",
                                                 dtype=torch.bfloat16)
    model = ray.train.torch.prepare_model(model, parallel_strategy="fsdp", parallel_strategy_kwargs={
        "auto_wrap_policy": functools.partial(size_based_auto_wrap_policy, min_num_params=int(1e7))})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    # At world size 1 prepare_model returns the model unwrapped (ray/train/torch/
    # train_loop_utils.py: it wraps only `if parallel_strategy and world_size > 1`), so there is
    # no no_sync() and nothing to communicate: both references then run the same step.
    no_sync = no_sync and hasattr(model, "no_sync")

    def step(micro):
        for i, (inputs, labels) in enumerate(micro):  # without no_sync: reduce every micro-batch
            quiet = no_sync and i < len(micro) - 1
            with model.no_sync() if quiet else contextlib.nullcontext():
                (model(input_ids=inputs, labels=inputs).loss / len(micro)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, (model, opt)


def _profile(step, batches, device, rank: int, trace_path: Path) -> dict | None:
    """Profile on rank 0 only; the other ranks run the same steps to keep the collectives paired."""
    from bench.step_profile import profile_steps

    if rank == 0:
        return profile_steps(step, batches, device, trace_path)
    for micro in batches:
        step(micro)
    return None


def _with_documents(batches: list, documents: int, seq_len: int) -> list:
    """The same tokens as packed rows of `documents` equal documents: per-document positions,
    and no label across a boundary (as training/data/packing.py makes them)."""
    import torch

    from training.model.loss import IGNORE_INDEX

    length = seq_len // documents
    positions = (torch.arange(seq_len) % length).expand(1, -1)
    out = []
    for micro in batches:
        step = []
        for inputs, labels in micro:
            labels = labels.masked_fill((positions == length - 1).to(labels.device), IGNORE_INDEX)
            step.append((inputs, labels, positions.to(inputs.device).expand_as(inputs)))
        out.append(step)
    return out


def _ours_step(cfg: TrainConfig, model_cfg, device):
    from training.step.engine import build_engine, lr_at, train_step

    engine = build_engine(cfg, model_cfg, device)

    def step(micro):
        train_step(engine, micro, lr_at(10, cfg), cfg.grad_clip)
    return step, engine


def _compute_only_seconds(engine, micro, device) -> float:
    """Seconds per micro-batch of forward + backward with no communication: gradients stay
    unsharded and unreduced (no sync), and the weights, gathered once, stay gathered. The
    step-time model's compute input. Leaves the engine unusable for training (call it last)."""
    model = engine.model
    model.set_requires_gradient_sync(False)
    model.set_reshard_after_forward(False)
    model.set_reshard_after_backward(False)

    def fwd_bwd(batch):
        model(*batch).backward()

    fwd_bwd(micro[0])  # gathers every group once
    times = _back_to_back_seconds([lambda b=b: fwd_bwd(b) for b in micro * 2], device)
    return statistics.median(times)


def _probe_reference(device) -> dict:
    """The reference shards over all workers: probe the world group as one shard group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from training.network.bandwidth import probe

    return probe(init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("shard",)),
                 device)


def bench_func(opts: dict) -> None:
    """Per worker: matmul rate, then each variant in turn; rank 0 reports all rows."""
    import ray.train
    import torch
    import torch.distributed as dist

    from training.network import transport
    from training.data.random_tokens import random_batch
    from training.step.engine import memory_limit_bytes
    from training.driver.ray_setup import worker_context
    from training.step.metrics import flops_per_token, peak_flops
    from training.model.model import count_params, model_config

    rank, world, _, device = worker_context()
    log_path = transport.capture_nccl_log(rank)
    link = transport.check_transport(log_path, device, "any", "warn")
    base = TrainConfig(model=opts["model"], seq_len=opts["seq_len"],
                       micro_batch_size=opts["micro_batch_size"], grad_accum=opts["grad_accum"],
                       num_workers=world, memory_budget_gib=opts["memory_budget_gib"])
    memory_limit_bytes(base, device)  # applies the budget to every variant, the reference too
    model_cfg = model_config(base.model)
    matmul = _matmul_tflops(device)
    n_steps = opts["warmup"] + opts["steps"]
    batches = [[tuple(t.to(device) for t in random_batch(
        seed=0, rank=rank, step=s, micro=m, batch=base.micro_batch_size, seq_len=base.seq_len,
        vocab=model_cfg.vocab_size, repeat=False)) for m in range(base.grad_accum)]
        for s in range(n_steps)]
    rows = []
    for name in opts["variants"]:
        cfg = dataclasses.replace(base, **VARIANTS.get(name, {}))
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        row = {"variant": name}
        docs = DOCUMENTS_PER_ROW.get(name)
        row_batches = _with_documents(batches, docs, base.seq_len) if docs else batches
        try:
            if name in REFERENCES:
                if device.type != "cuda":
                    raise RuntimeError("skipped: FSDP1 prepare_model needs a GPU")
                step, keep = _reference_step(model_cfg, device, no_sync=name == REFERENCE_NO_SYNC)
                row["bandwidth"] = _probe_reference(device)
            else:
                from training.network.bandwidth import probe

                step, keep = _ours_step(cfg, model_cfg, device)
                row.update(dataclasses.asdict(keep.plan))
                row["bandwidth"] = probe(keep.mesh, device)
            times = _time_steps(step, row_batches, opts["warmup"], opts["steps"], device)
            if opts["profile_dir"]:
                row["profile"] = _profile(step, row_batches[:2], device, rank,
                                          Path(opts["profile_dir"]) / f"{name}.trace.json.gz")
            step_s = statistics.median(times)
            tps = cfg.tokens_per_step_per_worker / step_s
            row.update(step_time_ms=step_s * 1000, tokens_per_s_per_gpu=tps,
                       tokens_per_step=cfg.tokens_per_step_per_worker * world)
            row["peak_mem_gib"] = (torch.cuda.max_memory_allocated(device) / 2**30
                                   if device.type == "cuda" else None)  # before the probe below
            if name not in REFERENCES:
                try:
                    row["compute_ms_per_micro_batch"] = 1000 * _compute_only_seconds(
                        keep, row_batches[0], device)
                except Exception as e:  # e.g. the unsharded gradients exceed a memory budget
                    row["compute_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            del step, keep
        except Exception as e:  # an OOM or a broken lever is a result row, not a lost run
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}" if str(e) else \
                type(e).__name__
        row.setdefault("peak_mem_gib", torch.cuda.max_memory_allocated(device) / 2**30
                       if device.type == "cuda" else None)
        rows.append(row)
        gc.collect()
        dist.barrier()
    # Same FLOPs accounting as the job: 6N (tied head counted once) + attention.
    from training.model.model import build_model
    with torch.device("meta"):
        n_params = count_params(build_model(base.model, model_cfg, seed=0))
    fpt = flops_per_token(n_params, model_cfg.num_hidden_layers, model_cfg.hidden_size, base.seq_len)
    peak = peak_flops(torch.cuda.get_device_name(device) if device.type == "cuda" else None)
    for row in rows:
        if "tokens_per_s_per_gpu" in row:
            row["mfu"] = row["tokens_per_s_per_gpu"] * fpt / peak if peak else None
            row["mfu_measured_matmul"] = (row["tokens_per_s_per_gpu"] * fpt / (matmul * 1e12)
                                          if matmul else None)
    env = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        or "cpu",
        "world_size": world, "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None,
        "matmul_tflops": matmul, "flops_per_token": fpt, "num_params": n_params,
        "nccl_transport": link.verdict,
        "nccl_env": {k: v for k, v in os.environ.items() if k in ("NCCL_P2P_DISABLE",
                                                                  "NCCL_SHM_DISABLE", "NCCL_NET")},
    }
    # Ray Train keeps the metrics of checkpointed reports: rank 0 ships the result as one.
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        checkpoint = None
        if rank == 0:
            Path(d, "bench.json").write_text(json.dumps({"env": env, "rows": rows}))
            checkpoint = ray.train.Checkpoint.from_directory(d)
        ray.train.report({}, checkpoint=checkpoint)


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.config import LoggingConfig

    from training.driver.ray_setup import worker_env

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(logging_level="ERROR", runtime_env={"env_vars": worker_env()})
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        workers = args.num_workers or gpus or 2
        opts = {"model": args.model, "seq_len": args.seq_len,
                "micro_batch_size": args.micro_batch_size, "grad_accum": args.grad_accum,
                "steps": args.steps,
                "warmup": args.warmup, "variants": args.variants.split(","),
                "memory_budget_gib": args.memory_budget_gib,
                "profile_dir": str(args.profile_dir.resolve()) if args.profile_dir else None}
        trainer = TorchTrainer(bench_func, train_loop_config=opts,
                               scaling_config=ScalingConfig(num_workers=workers, use_gpu=gpus > 0),
                               run_config=RunConfig(name="bench", storage_path=str(args.work_dir),
                                                    logging_config=LoggingConfig("WARNING")))
        with trainer.fit().checkpoint.as_directory() as d:
            result = json.loads(Path(d, "bench.json").read_text())
    finally:
        if started_here:
            ray.shutdown()
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


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(result: dict) -> str:
    env, s = result["env"], result["settings"]
    lines = [f"{env['gpu']} x{env['world_size']}, torch {env['torch']}, NCCL {env['nccl']}, "
             f"matmul {fmt(env['matmul_tflops'], '.0f')} TFLOP/s, seq {s['seq_len']}, "
             f"micro-batch {s['micro_batch_size']} x {s.get('grad_accum', 1)} accumulated, "
             f"NCCL transport {env['nccl_transport']}",
             f"{'variant':<28} {'tok/s/GPU':>10} {'MFU':>6} {'MFU mm':>6} {'step ms':>8} "
             f"{'peak GiB':>9} {'vs ref':>7}   (MFU: datasheet peak; MFU mm: measured matmul)"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"{r['variant']:<28} {r['error']}")
            continue
        lines.append(f"{r['variant']:<28} {r['tokens_per_s_per_gpu']:>10,.0f} "
                     f"{fmt(r.get('mfu'), '.3f'):>6} {fmt(r.get('mfu_measured_matmul'), '.3f'):>6} "
                     f"{r['step_time_ms']:>8.1f} "
                     f"{fmt(r['peak_mem_gib'], '.1f'):>9} {fmt(r.get('vs_reference'), '.2f'):>7}")
        bw = r.get("bandwidth") or {}
        if bw or "compute_ms_per_micro_batch" in r:
            lines.append(f"    compute {fmt(r.get('compute_ms_per_micro_batch'), '.1f')} ms per "
                         f"micro-batch without communication; bus GB/s: all-gather "
                         f"{fmt(bw.get('allgather_busbw_gbps'), '.2f')}, all-reduce "
                         f"{fmt(bw.get('allreduce_busbw_gbps'), '.2f')}")
        if r.get("profile") and r["profile"]["ms_per_step"]:
            lines.append("    device ms/step: " + ", ".join(
                f"{k} {v:g}" for k, v in r["profile"]["ms_per_step"].items()))
    return "\n".join(lines)


def variant_cell(row: dict) -> str:
    """The variant with what its settings resolved to, e.g. `ours (compiled, ZeRO-2)`: `ours` means
    the job's defaults, which change over time (rows before 2026-11-30 carry no plan; rows before
    issue 14 carry no mesh, reduce dtype or accumulation)."""
    if "compile" not in row:
        return row["variant"]
    plan = ["compiled" if row["compile"] else "eager",
            "ZeRO-3" if row["reshard_after_forward"] else "ZeRO-2"]
    if row["activation_checkpointing"]:
        plan.append("AC")
    if "mesh" in row:
        plan += [f"mesh {row['mesh']}", f"{row['reduce_dtype']} reduce"]
    if row.get("grad_accum", 1) > 1:
        plan.append(f"x{row['grad_accum']} accumulation")
        if row.get("accum_dtype", row["reduce_dtype"]) != row["reduce_dtype"]:
            plan.append(f"{row['accum_dtype']} accumulation")
    return f"{row['variant']} ({', '.join(plan)})"


def main(argv: list[str] | None = None) -> int:
    from training.driver import quiet

    quiet.install()
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    unknown = [v for v in args.variants.split(",") if v not in REFERENCES and v not in VARIANTS]
    if unknown:
        print(f"error: unknown --variants {unknown}; choose from {[*REFERENCES, *VARIANTS]}",
              file=sys.stderr)
        return 2
    result = run(args, argv)
    print(table(result))
    from bench.single import write_json

    write_json(result, args.json_out)
    return 0

