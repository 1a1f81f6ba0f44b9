"""`python -m bench.step_model`: predict a training step's time on a topology from measured inputs.

For a plan (mesh replicas x shard, reduce dtype, ZeRO-2/3, micro-batch, accumulation) and links
(bus bandwidth of the shard group's and of the replicate group's collectives, as the job's warm-up
probe measures them) it gives the compute time, the bytes each rank moves on each link, the exposed
communication and tokens/s per GPU. Compute per micro-batch is measured (the benchmark's
communication-free forward + backward) or derived from a compute rate.

The overlap rule: FSDP issues one collective per layer group and computes layer by layer, so
compute c and communication m of a phase (one micro-batch's forward, or its backward) run as a
two-stage pipeline of L layers: max(c, m) + min(c, m) / L. Forward is 1/3 of the compute, backward
2/3 (with activation checkpointing the forward is recomputed in backward). Gathers happen in the
first micro-batch's forward (ZeRO-2 keeps the weights), or in every forward and backward (ZeRO-3,
FSDP1); gradients are reduced in the last micro-batch's backward (ours) or every one (the
reference: plain accumulation under FSDP1). Reduce-scatter and all-reduce run on different links
across nodes (overlapping), on the same link within one node (adding up). Not modelled: optimizer
step, kernel launch gaps, NCCL latency.

  --check RESULT.json ...   predict every benchmark row that carries its inputs; print the error
  --preset g6.12xlarge-x2   predict the reference approach and ours on 2 x g6.12xlarge
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.command import start
from training.step.metrics import PEAK_BF16_TFLOPS, flops_per_token
# The model itself lives with the job, which predicts a slow link's cost before its first step
# (training/network/link_floor.py); the job never imports bench/.
from training.step.step_time import Links, StepPlan, predict


def _mesh(text: str) -> tuple[int, int]:
    replicas, shard = text.split("x")
    return int(replicas), int(shard)


def check_row(row: dict, env: dict, settings: dict) -> dict | None:
    """Prediction vs measurement for one benchmark row of ours (it carries the plan, the probe's
    bandwidths and the communication-free compute time); None for rows without them."""
    if "compute_ms_per_micro_batch" not in row or "mesh" not in row:
        return None
    replicas, shard = _mesh(row["mesh"])
    bw = row["bandwidth"]
    from training.model.model import model_config

    layers = model_config(settings["model"]).num_hidden_layers
    plan = StepPlan(env["num_params"], layers, replicas, shard,
                    row["reduce_dtype"], not row["reshard_after_forward"], row["micro_batch_size"],
                    row["grad_accum"], settings["seq_len"], row["activation_checkpointing"])
    links = Links(bw["allgather_busbw_gbps"], bw["allreduce_busbw_gbps"], separate=False)
    pred = predict(plan, row["compute_ms_per_micro_batch"] / 1000, links)
    measured = row["step_time_ms"] / 1000
    return {"variant": row["variant"], "transport": env["nccl_transport"], "mesh": row["mesh"],
            "reduce_dtype": row["reduce_dtype"], "micro_batch": row["micro_batch_size"],
            "grad_accum": row["grad_accum"], "measured_step_s": measured,
            "predicted_step_s": pred.step_s, "error": pred.step_s / measured - 1,
            "predicted_exposed_comm_s": pred.exposed_comm_s,
            "links_gbps": [bw["allgather_busbw_gbps"], bw["allreduce_busbw_gbps"]]}


def check(paths: list[Path]) -> dict:
    rows = []
    for path in paths:
        result = json.loads(path.read_text())
        for row in result["rows"]:
            if (checked := check_row(row, result["env"], result["settings"])) is not None:
                rows.append({**checked, "source": path.name})
    worst = max((abs(r["error"]) for r in rows), default=None)
    mean = sum(abs(r["error"]) for r in rows) / len(rows) if rows else None
    return {"rows": rows, "max_abs_error": worst, "mean_abs_error": mean}


# 2 x g6.12xlarge (stack/catalog.py: 4 x NVIDIA L4 per node, one 40 Gbps EFA interface).
L4_NODES, L4_PER_NODE, L4_NETWORK_GBPS, L4_BUDGET_GIB = 2, 4, 40, 22
QWEN = "qwen2.5-1.5b"
QWEN_PARAMS, QWEN_LAYERS, QWEN_HIDDEN = 1_543_714_304, 28, 1536
# The AWS sample's published run on 8 x L4 over EFA (seq 128, batch 1): design notes, from its README.
AWS_SAMPLE_STEPS_PER_S = 0.5173


def _ours_on_l4(tokens_per_step: int, seq_len: int, reduce_dtype: str) -> StepPlan:
    """What the job resolves on 2 x g6.12xlarge: HSDP one replica per node, and the planner's
    micro-batch, accumulation, checkpointing and ZeRO stage for 22 GiB per L4."""
    from training.config import TrainConfig
    from training.step.engine import resolve_plan
    from training.step.memory import Footprint
    from training.model.model import model_config

    world = L4_NODES * L4_PER_NODE
    cfg = TrainConfig(model=QWEN, seq_len=seq_len, num_workers=world,
                      tokens_per_step=tokens_per_step, reduce_dtype=reduce_dtype).validated()
    fp = Footprint(model_config(QWEN), QWEN_PARAMS, L4_PER_NODE, L4_BUDGET_GIB * 2**30,
                   compiled=True, world=world)
    plan = resolve_plan(cfg, fp, world, f"{L4_NODES}x{L4_PER_NODE}", on_gpu=True)
    return StepPlan(QWEN_PARAMS, QWEN_LAYERS, L4_NODES, L4_PER_NODE, reduce_dtype,
                    not plan.reshard_after_forward, plan.micro_batch_size, plan.grad_accum, seq_len,
                    plan.activation_checkpointing)



def g6_predictions(compute_mfu: float, intra_gbps: float, inter_gbps: float,
                   tokens_per_step: int, seq_len: int = 2048) -> list[dict]:
    """The reference approach (the AWS sample: FSDP1 over all 8 GPUs, bf16 weights and gradients,
    micro-batch 1; at its own sequence 128, at ours, and accumulating to our batch) and ours (the
    plan the job resolves there, with fp32 and with bf16 gradient reduction)."""
    world = L4_NODES * L4_PER_NODE
    rate = PEAK_BF16_TFLOPS["NVIDIA L4"] * 1e12 * compute_mfu

    def compute(plan: StepPlan) -> float:
        fpt = flops_per_token(QWEN_PARAMS, QWEN_LAYERS, QWEN_HIDDEN, plan.seq_len)
        return plan.micro_batch * plan.seq_len * fpt / rate * (4 / 3 if plan.checkpointing else 1)

    # FSDP1 over 8 ranks across nodes: NCCL's ring crosses the one NIC: the slower link sets it.
    world_link = Links(min(intra_gbps, inter_gbps), None, separate=False)
    # HSDP: the 4 replicate groups (one per local GPU) share the node's one NIC at once.
    hsdp_link = Links(intra_gbps, inter_gbps / L4_PER_NODE, separate=True)
    seqs_per_rank = tokens_per_step // (seq_len * world)

    def reference(seq: int, accum: int) -> StepPlan:
        return StepPlan(QWEN_PARAMS, QWEN_LAYERS, 1, world, "bf16", False, 1, accum, seq,
                        reduce_every_micro_batch=True)

    ours_bf16 = _ours_on_l4(tokens_per_step, seq_len, "bf16")
    batch = f"{tokens_per_step:,} tokens/step"
    plans = [
        ("reference, the AWS sample's own (seq 128, mb 1)", reference(128, 1), world_link),
        ("reference at seq 2048, mb 1", reference(seq_len, 1), world_link),
        (f"reference at {batch} (mb 1, accumulating)", reference(seq_len, seqs_per_rank),
         world_link),
        (f"ours, fp32 reduce, {batch}", _ours_on_l4(tokens_per_step, seq_len, "fp32"), hsdp_link),
        (f"ours, bf16 reduce, {batch}", ours_bf16, hsdp_link),
        ("ours, bf16 reduce, one micro-batch per step",
         StepPlan(**{**asdict(ours_bf16), "grad_accum": 1}), hsdp_link),
    ]
    out = []
    for name, plan, links in plans:
        pred = predict(plan, compute(plan), links)
        out.append({"name": name, "plan": asdict(plan), **asdict(pred),
                    "steps_per_s": 1 / pred.step_s})
    return out


def _print_check(result: dict) -> None:
    print(f"{'source':<28} {'variant':<24} {'link':<16} {'mesh':>5} {'reduce':>6} {'mb x acc':>8} "
          f"{'measured s':>10} {'model s':>8} {'error':>7}")
    for r in result["rows"]:
        print(f"{r['source']:<28} {r['variant']:<24} {r['transport']:<16} {r['mesh']:>5} "
              f"{r['reduce_dtype']:>6} {r['micro_batch']:>3} x {r['grad_accum']:<3} "
              f"{r['measured_step_s']:>10.3f} {r['predicted_step_s']:>8.3f} {r['error']:>+7.1%}")
    if result["rows"]:
        print(f"mean |error| {result['mean_abs_error']:.1%}, max |error| {result['max_abs_error']:.1%}"
              f" over {len(result['rows'])} measured rows")


def _print_g6(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"2 x g6.12xlarge (8 x L4), compute at {args.compute_mfu:.2f} of the L4's "
          f"{PEAK_BF16_TFLOPS['NVIDIA L4']:.0f} TFLOP/s, intra-node {args.intra_gbps} GB/s, "
          f"inter-node {args.inter_gbps} GB/s (bus bandwidth)")
    print(f"{'plan':<52} {'mb x acc':>8} {'ZeRO':>4} {'step s':>7} {'steps/s':>8} "
          f"{'exposed s':>9} {'tok/s/GPU':>10}")
    for r in rows:
        p = r["plan"]
        print(f"{r['name']:<52} {p['micro_batch']:>3} x {p['grad_accum']:<3} "
              f"{2 if p['zero2'] else 3:>4} {r['step_s']:>7.2f} {r['steps_per_s']:>8.3f} "
              f"{r['exposed_comm_s']:>9.2f} {r['tokens_per_s_per_gpu']:>10,.0f}")
    sample = rows[0]["steps_per_s"]
    print(f"check: the AWS sample's published {AWS_SAMPLE_STEPS_PER_S} steps/s on this hardware; "
          f"model {sample:.3f} ({sample / AWS_SAMPLE_STEPS_PER_S - 1:+.1%})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.step_model", description=__doc__.split("\n")[0])
    ap.add_argument("--check", type=Path, nargs="+", default=None,
                    help="benchmark JSON results (--json-out) to check the model against")
    ap.add_argument("--preset", choices=["g6.12xlarge-x2"], default=None)
    ap.add_argument("--compute-mfu", type=float, default=0.5, help="fraction of the GPU's "
                    "datasheet bf16 peak a communication-free micro-batch reaches (preset)")
    ap.add_argument("--intra-gbps", type=float, default=10.0, help="NCCL bus bandwidth within a "
                    "node, GB/s (preset: L4s on PCIe, no NVLink)")
    ap.add_argument("--inter-gbps", type=float, default=L4_NETWORK_GBPS / 8 * 0.8,
                    help="NCCL bus bandwidth of the node's network, GB/s (preset: 80%% of one "
                    "40 Gbps EFA interface)")
    ap.add_argument("--tokens-per-step", type=int, default=8 * 16 * 2048)
    ap.add_argument("--json-out", type=Path, default=None)
    ap.add_argument("--md-out", type=Path, default=None, help="append the printed tables, with "
                    "the command and date, to this markdown file (bench/MODEL.md)")
    args, argv = start(ap, argv)
    if not args.check and not args.preset:
        ap.error("give --check RESULT.json ... and/or --preset g6.12xlarge-x2")
    out: dict = {}
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        if args.check:
            out["check"] = check(args.check)
            _print_check(out["check"])
        if args.preset:
            out["g6.12xlarge-x2"] = {"inputs": {k: getattr(args, k) for k in (
                "compute_mfu", "intra_gbps", "inter_gbps", "tokens_per_step")},
                "rows": g6_predictions(args.compute_mfu, args.intra_gbps, args.inter_gbps,
                                       args.tokens_per_step)}
            _print_g6(out["g6.12xlarge-x2"]["rows"], args)
    print(text.getvalue(), end="")
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=2))
    if args.md_out:
        command = "python -m bench.step_model " + shlex.join(argv)
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        if not args.md_out.exists():
            args.md_out.write_text("# Step-time model: checks against measured runs, predictions\n\n"
                                   "Sections are appended by `python -m bench.step_model --md-out`; "
                                   "never edited by hand. The model and its inputs: step_model.py's "
                                   "docstring; what the numbers mean: NOTES.md.\n")
        with args.md_out.open("a") as f:
            f.write(f"\n## {date}\n`{command}`\n\n```\n{text.getvalue()}```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
