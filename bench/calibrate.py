"""`python -m bench.calibrate`: the memory planner's estimate against measured peaks.

For each shape of a grid (micro-batch, sequence length, compile, ZeRO-2/3, activation
checkpointing, accumulation) it builds the job's engine on one GPU (`build_engine`, one rank),
runs a few optimizer steps and records the planner's `estimated_peak_gib`
(`training.step.memory.estimate_bytes` for the plan the engine resolved) beside `peak_gib`, measured:
`torch.cuda.max_memory_reserved` plus the device memory outside torch's allocator (CUDA context,
NCCL, kernels: `mem_get_info`'s used bytes less what torch has reserved). Reserved, not allocated,
because the caching allocator runs out of device memory when its reserve cannot grow; allocated
is recorded too. `--fit FILES` reads recorded results and prints each row's error with the
current constants and the constants a least-squares fit would give (training/step/memory.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from pathlib import Path

from bench.command import refuse, start
from bench.single import device_peak, environment, one_rank, write_json
from training.config import TrainConfig

KIND = "memory-calibration"
GIB = 2**30
LOW, HIGH = -0.10, 0.15  # the estimate within 10% below, or up to 15% above (the safe side)
# LoRA's tighter band: a 7B base leaves an L4 little room, 15% over would refuse plans that fit
LORA_LOW, HIGH_LORA = -0.10, 0.05
RECORDED_KINDS = (KIND, "lora")  # bench.lora's rows record the same estimate inputs and peaks
FACTORS = [i / 1000 for i in range(8000)]  # the activation factors `fit` scans

# TrainConfig overrides per row, every lever explicit so the plan is the row's, not the planner's.
# Ordered for compile time: compiled rows of one layer graph first (Dynamo recompiles once for a
# dynamic batch dimension, then reuses it), the one compiled checkpointed graph, then eager rows.
_ZERO2 = {"reshard_after_forward": False, "activation_checkpointing": False}
_ZERO3 = {"reshard_after_forward": True, "activation_checkpointing": False}
_ZERO3_AC = {"reshard_after_forward": True, "activation_checkpointing": True}
GRID: list[dict] = [
    {"micro_batch_size": 4, "compile": True, **_ZERO2},
    {"micro_batch_size": 8, "compile": True, **_ZERO2},
    {"micro_batch_size": 2, "compile": True, **_ZERO2},
    {"micro_batch_size": 2, "grad_accum": 4, "reduce_dtype": "bf16", "compile": True, **_ZERO2},
    {"micro_batch_size": 2, "grad_accum": 4, "reduce_dtype": "bf16", "accum_dtype": "fp32",
     "compile": True, **_ZERO2},
    {"micro_batch_size": 4, "compile": True, **_ZERO3},
    {"micro_batch_size": 8, "compile": True, **_ZERO3_AC},
    {"micro_batch_size": 4, "compile": False, **_ZERO2},
    {"micro_batch_size": 2, "seq_len": 4096, "compile": False, **_ZERO2},
    {"micro_batch_size": 4, "compile": False, **_ZERO3},
    {"micro_batch_size": 4, "compile": False, **_ZERO3_AC},
]

# LoRA (rank 16, all seven projections, a replicated bf16 base as the planner picks it): the
# shapes the planner must get right for an L4, 7B at 512..2048 and 1.5B at 1024..2048, micro-batch
# 1 and 2, with and without checkpointing; the most wanted first (a timeout keeps the rows done).
# "shard_base": the frozen base sharded by FSDP2 instead (the plan before it was replicated).
_LORA = {"lora_rank": 16, "lora_alpha": 32.0, "compile": True, "reshard_after_forward": True,
         "grad_accum": 2}
_7B, _1B = {"model": "large", **_LORA}, {"model": "small", **_LORA}  # --large-model, --model
LORA_GRID: list[dict] = [
    {**(_7B if large else _1B), "seq_len": seq, "micro_batch_size": mb,
     "activation_checkpointing": ac}
    for large, seq, mb, ac in (
        (True, 2048, 1, True), (True, 512, 1, False), (True, 512, 4, True), (True, 1024, 2, True),
        (True, 2048, 2, True), (True, 512, 2, True), (False, 2048, 2, False),
        (False, 2048, 1, True), (True, 1024, 1, False), (True, 512, 1, True),
        (False, 1024, 2, True), (False, 1024, 1, False), (True, 512, 2, False),
        (True, 1024, 1, True), (False, 2048, 2, True), (True, 2048, 1, False))
] + [{**_7B, "seq_len": 512, "micro_batch_size": 1, "activation_checkpointing": False,
      "shard_base": True}]
GRIDS = {"full": GRID, "lora": LORA_GRID}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.calibrate",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--large-model", default="qwen2.5-7b", help="the LoRA grid's large shape")
    ap.add_argument("--seq-len", type=int, default=2048, help="rows that set none")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per row")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="full", help="full fine-tuning's "
                    "shapes (of --model, --seq-len) or LoRA's (each row names its own)")
    ap.add_argument("--rows", default=None, help="comma-separated row numbers of the grid "
                    "(from 0); default: all")
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--fit", type=Path, nargs="+", default=None, help="recorded results: print "
                    "each row's error and the fitted constants instead of measuring")
    return ap


def estimate_inputs(engine, cfg: TrainConfig) -> dict:
    """What `training.step.memory.estimate_from` needs to recompute this row's estimate later."""
    plan = engine.plan
    return {"model": cfg.model, "vocab_size": engine.model.lm.config.vocab_size,
            "num_params": engine.num_params, "shard_size": int(plan.mesh.split("x")[1]),
            "world": 1, "compiled": plan.compile, "micro_batch": plan.micro_batch_size,
            "seq_len": cfg.sample_tokens, "grad_accum": plan.grad_accum,
            "reduce_dtype": plan.reduce_dtype, "accum_dtype": plan.accum_dtype,
            "checkpointing": plan.activation_checkpointing,
            "zero2": not plan.reshard_after_forward, "loss_chunk_tokens": plan.loss_chunk_tokens,
            "replicated_base": plan.replicate_base, "lora_dropout": cfg.lora_dropout > 0,
            "trainable_params": engine.trainable_params if engine.lora else None}


def _sharded_base(engine_module):
    """The engine's planner with the frozen base sharded (a grid row's `shard_base`)."""
    import contextlib
    from unittest import mock

    if engine_module is None:
        return contextlib.nullcontext()
    plan_step = engine_module.plan_step

    def sharded(*a, **kw):
        return dataclasses.replace(plan_step(*a, **kw), replicate_base=False)

    return mock.patch.object(engine_module, "plan_step", sharded)


def _measure_row(overrides: dict, args: argparse.Namespace, device) -> dict:
    import torch

    from training.data.random_tokens import random_batch
    from training.step import engine as engine_module
    from training.step.engine import build_engine, train_step
    from training.step.memory import estimate_from
    from training.model.model import model_config

    overrides = dict(overrides)
    shard_base = overrides.pop("shard_base", False)
    named = {"large": args.large_model, "small": args.model}
    if "model" in overrides:
        overrides["model"] = named[overrides["model"]]
    cfg = TrainConfig(**{"model": args.model, "seq_len": args.seq_len, "num_workers": 1,
                         "warmup_steps": 0, **overrides}).validated()
    cuda = device.type == "cuda"
    row: dict = {"shape": {**overrides, **({"shard_base": True} if shard_base else {})}}
    try:
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            row["leftover_gib"] = torch.cuda.memory_allocated(device) / GIB
        model_cfg = model_config(cfg.model)
        with _sharded_base(engine_module if shard_base else None):
            engine = build_engine(cfg, model_cfg, device)
        for step in range(args.steps):
            micro = [random_batch(seed=0, rank=0, step=step, micro=m, batch=cfg.micro_batch_size,
                                  seq_len=cfg.seq_len, vocab=model_cfg.vocab_size, repeat=False)
                     for m in range(cfg.grad_accum)]
            train_step(engine, micro, 1e-4, cfg.grad_clip)
            if cuda:
                torch.cuda.synchronize(device)
            if step == 0:  # the steps after the first (which compiles): tokens/s
                started = time.perf_counter()
        if args.steps > 1:
            tokens = (args.steps - 1) * cfg.grad_accum * cfg.micro_batch_size * cfg.seq_len
            row["tokens_per_s"] = tokens / (time.perf_counter() - started)
        inputs = estimate_inputs(engine, cfg)
        row.update(inputs=inputs, estimated_peak_gib=estimate_from(inputs) / GIB)
        row.update(device_peak(device))
        if cuda:
            row["estimate_error"] = row["estimated_peak_gib"] / row["peak_gib"] - 1
        del engine
    except Exception as e:  # an OOM is a result row, not a lost grid
        row["error_text"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    gc.collect()
    return row


def measure(args: argparse.Namespace, device, env: dict) -> dict:
    """Every picked row; the JSON is rewritten after each, so a timeout keeps the rows done."""
    grid = GRIDS[args.grid]
    picked = [int(i) for i in args.rows.split(",")] if args.rows else range(len(grid))
    result = {"kind": KIND, "env": env, "rows": [],
              "settings": {"model": args.model, "seq_len": args.seq_len, "steps": args.steps,
                           "grid": args.grid}}
    for i in picked:
        result["rows"].append(_measure_row(grid[i], args, device))
        shown = ("shape", "estimated_peak_gib", "peak_gib", "estimate_error", "tokens_per_s",
                 "error_text")
        print(json.dumps({k: result["rows"][-1].get(k) for k in shown}), flush=True)
        write_json(result, args.json_out)
    return result


def recorded_rows(paths: list[Path]) -> list[dict]:
    """Measured rows (with a peak) of the calibration results among `paths`, and of bench.lora's
    (`RECORDED_KINDS`: the job's engine under the planner, with the same estimate inputs)."""
    rows = []
    for path in paths:
        result = json.loads(path.read_text())
        if result.get("kind") in RECORDED_KINDS:
            rows += [r for r in result["rows"] if r.get("peak_gib") and _known(r, result)]
    return rows


def _known(row: dict, result: dict) -> bool:
    """A row whose plan the estimate can rebuild: bench.lora's from 2026-12-02 on, when its
    inputs began to say whether the frozen base was replicated (before, the engine sharded it
    even on one GPU, a plan the planner no longer makes and the inputs do not name)."""
    inputs = row.get("inputs")
    return bool(inputs) and (result["kind"] == KIND or "replicated_base" in inputs)


def label(row: dict) -> str:
    """A recorded row's shape: the grid's overrides, or bench.lora's run and plan."""
    if "shape" in row:
        return ", ".join(f"{k}={v}" for k, v in row["shape"].items())
    i = row["inputs"]
    return (f"{row['run']}: {i['model']}, {i['micro_batch']} x {i['seq_len']}, accum "
            f"{i['grad_accum']}, checkpointing={i['checkpointing']}, chunk {i['loss_chunk_tokens']}")


def band(row: dict) -> tuple[float, float]:
    """The error a recorded row's estimate is held to: LoRA's tighter band, or full's."""
    lora = row["inputs"].get("trainable_params") is not None
    return (LORA_LOW, HIGH_LORA) if lora else (LOW, HIGH)


def fit(rows: list[dict]) -> dict:
    """ACTIVATION_FACTOR of training/step/memory.py's form (`Parts.at_factor`: the larger of the
    loss's moment and the activations' with the factor on the activations) from measured
    one-GPU rows, with STATIC_FACTOR and FIXED_GIB held (one GPU cannot tell them apart: see
    training/step/memory.py). Full fine-tuning's by least squares in bytes; LoRA's
    (LORA_ACTIVATION_FACTOR) centred in the band its planner is held to (`centred`). Each is a
    scan in steps of 0.001; where rows leave a factor free (their peak is the loss's moment
    whatever it is) the largest of the equal ones, the safe side."""
    import numpy as np

    from training.step.memory import parts_from

    groups: dict[tuple[bool, bool, bool], list[tuple]] = {}
    for r in rows:
        p = parts_from(r["inputs"])
        groups.setdefault((p.lora, p.compiled, p.checkpointing), []).append(
            (p, r["peak_gib"] * GIB))
    out: dict[str, dict] = {"ACTIVATION_FACTOR": {}, "LORA_ACTIVATION_FACTOR": {}}
    for (lora, *key), pairs in sorted(groups.items()):
        miss = np.array([[p.at_factor(f) - peak for p, peak in pairs] for f in FACTORS])
        peaks = np.array([peak for _, peak in pairs])
        cost = (centred(miss / peaks) if lora else (miss ** 2).sum(axis=1))
        best = len(FACTORS) - 1 - int(np.argmin(cost[::-1]))  # ties: the largest factor
        table = out["LORA_ACTIVATION_FACTOR" if lora else "ACTIVATION_FACTOR"]
        table[tuple(key)] = float(round(FACTORS[best], 3))
    return out


def centred(errors, low: float = LORA_LOW, high: float = HIGH_LORA):
    """Per candidate factor (a row of `errors`, one column a measured row), the worst distance of
    its errors from the middle of [low, high], ties broken by the mean distance: the factor to
    pick lies most centrally."""
    import numpy as np

    distance = np.abs(errors - (low + high) / 2)
    return distance.max(axis=1) + 1e-6 * distance.mean(axis=1)  # ties: nearer on average


def _errors(rows: list[dict]) -> list[float]:
    from training.step.memory import GIB as _GIB, estimate_from

    return [estimate_from(r["inputs"]) / (r["peak_gib"] * _GIB) - 1 for r in rows]


def report(rows: list[dict]) -> str:
    """Each row's error with the current constants; the fitted constants as lines to paste into
    training/step/memory.py, and the error range they would give."""
    from unittest import mock

    from training.step import memory

    errors = _errors(rows)
    lines = [f"{'shape':<72} {'peak GiB':>8} {'est GiB':>8} {'error':>7}"]
    for r, err in zip(rows, errors):
        low, high = band(r)
        flag = "" if low <= err <= high else "  OUT"
        shape = label(r)
        lines.append(f"{shape[:72]:<72} {r['peak_gib']:>8.2f} "
                     f"{(1 + err) * r['peak_gib']:>8.2f} {err:>+7.1%}{flag}")
    lines.append(f"error range {min(errors):+.1%} .. {max(errors):+.1%} (allowed "
                 f"{LOW:+.0%} .. {HIGH:+.0%})")
    got = fit(rows)
    fitted = {name: {**getattr(memory, name), **{k: round(f, 3) for k, f in got[name].items()}}
              for name in got}
    with mock.patch.multiple(memory, **fitted):
        refit = _errors(rows)
    lines += ["fitted constants for training/step/memory.py:",
              *(f"    {k} = {v}" for k, v in fitted.items()),
              f"with them: error range {min(refit):+.1%} .. {max(refit):+.1%}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args, argv = start(build_parser(), argv)
    if args.fit:
        rows = recorded_rows(args.fit)
        if not rows:
            return refuse("no measured calibration rows in those files")
        print(report(rows))
        return 0
    size = len(GRIDS[args.grid])
    if args.rows and not all(i.isdigit() and int(i) < size for i in args.rows.split(",")):
        return refuse(f"--rows takes numbers 0-{size - 1} for --grid {args.grid}")
    import torch._dynamo

    # Each row builds a new model of its own shape; past Dynamo's default of 8 graphs per code
    # object the later rows ran their layers eager ("hit config.recompile_limit (8)" in
    # bench/runs/2026-12-02/i40-lora-l4.log, from the 11th LoRA row on), measuring another plan.
    torch._dynamo.config.recompile_limit = 64
    with one_rank() as device:
        measure(args, device, environment(device, argv, "bench.calibrate"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
