"""`python -m bench.step_model`: predict a training step's time on a topology from measured inputs.

For a plan (mesh replicas x shard, reduce dtype, ZeRO-2/3, micro-batch, accumulation) and links
(bus bandwidth of the shard group's and of the replicate group's collectives, as the job's warm-up
probe measures them) it gives the compute time, the bytes each rank moves on each link, the exposed
communication and tokens/s per GPU. Compute per micro-batch is measured (the benchmark's
communication-free forward + backward) or derived from a compute rate.

The overlap rule: FSDP issues one collective per layer group and computes layer by layer, so
compute c and communication m of a phase (one micro-batch's forward, or its backward) run as a
two-stage pipeline of L layers: max(c, m) + min(c, m) / L. Forward is 1/3 of the compute, backward
2/3 (LoRA: about 1/2 each, a frozen base getting no weight gradients; with activation
checkpointing the forward is recomputed in backward). Gathers happen in the
first micro-batch's forward (ZeRO-2 keeps the weights), or in every forward and backward (ZeRO-3,
FSDP1); gradients are reduced in the last micro-batch's backward (ours) or every one (the
reference: plain accumulation under FSDP1). Reduce-scatter and all-reduce run on different links
across nodes (overlapping), on the same link within one node (adding up). Not modelled: optimizer
step, kernel launch gaps, NCCL latency.

  --check RESULT.json ...   predict every benchmark row that carries its inputs; print the error
  --preset g6.12xlarge-x2   predict the reference approach and ours on 2 x g6.12xlarge, and
                            the 7B LoRA recipe with its frozen base replicated and sharded
                            (the planner's plan for each, or why it does not fit)
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from bench.command import start
from training.step.metrics import PEAK_BF16_TFLOPS, model_flops_per_token
# The model itself lives with the job, which predicts a slow link's cost before its first step
# (training/network/link_floor.py); the job never imports bench/.
from training.step.step_time import Links, StepPlan, compute_s, predict

if TYPE_CHECKING:
    from training.config import TrainConfig


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
L4_WORLD = L4_NODES * L4_PER_NODE
QWEN = "qwen2.5-1.5b"
QWEN_PARAMS, QWEN_LAYERS, QWEN_HIDDEN = 1_543_714_304, 28, 1536
# docs/lora.md's 7B recipe: rank 16 (alpha 32) on all 7 projections of a frozen Qwen2.5-7B.
LORA_MODEL, LORA_RANK, LORA_ALPHA = "qwen2.5-7b", 16, 32.0
# The AWS sample's published run on 8 x L4 over EFA (seq 128, batch 1): design notes, from its README.
AWS_SAMPLE_STEPS_PER_S = 0.5173


def _plan_on_l4(cfg: TrainConfig, params: int, trainable: int | None = None,
                replicated: bool = False) -> tuple[StepPlan, dict]:
    """What the job resolves on 2 x g6.12xlarge: HSDP one replica per node, and the planner's
    micro-batch, accumulation, checkpointing, ZeRO stage and loss chunk for 22 GiB per L4 (LoRA:
    the frozen base `replicated` on every GPU or sharded over the node's 4). The step model's
    plan and what else the planner chose, with its estimate; ConfigError where nothing fits."""
    from training.model.model import model_config
    from training.step.engine import resolve_plan
    from training.step.memory import Footprint, estimate_bytes

    mc = model_config(cfg.model)
    fp = Footprint(mc, params, L4_PER_NODE, L4_BUDGET_GIB * 2**30, compiled=True, world=L4_WORLD,
                   trainable_params=trainable, replicated_base=replicated)
    plan = resolve_plan(cfg, fp, L4_WORLD, f"{L4_NODES}x{L4_PER_NODE}", on_gpu=True)
    zero2, checkpointing = not plan.reshard_after_forward, plan.activation_checkpointing
    step = StepPlan(params, mc.num_hidden_layers, L4_NODES, L4_PER_NODE, cfg.reduce_dtype, zero2,
                    plan.micro_batch_size, plan.grad_accum, cfg.seq_len, checkpointing,
                    trainable=trainable, replicated_base=replicated)
    need = estimate_bytes(fp, micro_batch=plan.micro_batch_size, seq_len=cfg.seq_len,
                          grad_accum=plan.grad_accum, reduce_dtype=cfg.reduce_dtype,
                          accum_dtype=cfg.accum_dtype, checkpointing=checkpointing, zero2=zero2,
                          loss_chunk_tokens=plan.loss_chunk_tokens)
    return step, {"model": cfg.model, "hidden": mc.hidden_size,
                  "loss_chunk_tokens": plan.loss_chunk_tokens, "estimate_gib": need / 2**30}


def _ours_on_l4(tokens_per_step: int, seq_len: int, reduce_dtype: str) -> StepPlan:
    """Full fine-tuning of the 1.5B default as the job plans it on 2 x g6.12xlarge."""
    from training.config import TrainConfig

    cfg = TrainConfig(model=QWEN, seq_len=seq_len, num_workers=L4_WORLD,
                      tokens_per_step=tokens_per_step, reduce_dtype=reduce_dtype).validated()
    return _plan_on_l4(cfg, QWEN_PARAMS)[0]


def _lora_on_l4(tokens_per_step: int, seq_len: int,
                model: str = LORA_MODEL) -> list[tuple[str, StepPlan | str, dict]]:
    """The LoRA recipe of `model` (a built-in shape: the 7B default, or another family's)
    planned twice, its frozen base replicated and sharded: (name, step model's plan or why it
    does not fit, the planner's other choices)."""
    from training.config import TrainConfig
    from training.errors import ConfigError
    from training.model.lora import LoraSpec, count_on_meta
    from training.model.model import model_config

    cfg = TrainConfig(model=model, seq_len=seq_len, num_workers=L4_WORLD,
                      tokens_per_step=tokens_per_step, lora_rank=LORA_RANK,
                      lora_alpha=LORA_ALPHA).validated()
    params, trainable = count_on_meta(model_config(model), LoraSpec.from_config(cfg))
    label = "7B" if model == LORA_MODEL else model
    out = []
    for replicated in (True, False):
        name = f"{label} LoRA r{LORA_RANK}, base {'replicated' if replicated else 'sharded'}"
        try:
            out.append((name, *_plan_on_l4(cfg, params, trainable, replicated)))
        except ConfigError as e:
            out.append((name, "does not fit: " + "; ".join(e.problems), {}))
    return out


def g6_predictions(compute_mfu: float, intra_gbps: float, inter_gbps: float,
                   tokens_per_step: int, seq_len: int = 2048,
                   lora_model: str = LORA_MODEL) -> list[dict]:
    """The reference approach (the AWS sample: FSDP1 over all 8 GPUs, bf16 weights and gradients,
    micro-batch 1; at its own sequence 128, at ours, and accumulating to our batch), ours (the
    plan the job resolves there, with fp32 and with bf16 gradient reduction) and the 7B LoRA
    recipe with its frozen base replicated and sharded (each as the planner plans it, or why it
    does not fit: `fits` false, `why`)."""
    rate = PEAK_BF16_TFLOPS["NVIDIA L4"] * 1e12 * compute_mfu
    # FSDP1 over 8 ranks across nodes: NCCL's ring crosses the one NIC: the slower link sets it.
    world_link = Links(min(intra_gbps, inter_gbps), None, separate=False)
    # HSDP: the 4 replicate groups (one per local GPU) share the node's one NIC at once.
    hsdp_link = Links(intra_gbps, inter_gbps / L4_PER_NODE, separate=True)
    seqs_per_rank = tokens_per_step // (seq_len * L4_WORLD)

    def reference(seq: int, accum: int) -> StepPlan:
        return StepPlan(QWEN_PARAMS, QWEN_LAYERS, 1, L4_WORLD, "bf16", False, 1, accum, seq,
                        reduce_every_micro_batch=True)

    ours_bf16 = _ours_on_l4(tokens_per_step, seq_len, "bf16")
    batch = f"{tokens_per_step:,} tokens/step"
    qwen = {"model": QWEN, "hidden": QWEN_HIDDEN}
    plans = [
        ("reference, the AWS sample's own (seq 128, mb 1)", reference(128, 1), world_link, qwen),
        ("reference at seq 2048, mb 1", reference(seq_len, 1), world_link, qwen),
        (f"reference at {batch} (mb 1, accumulating)", reference(seq_len, seqs_per_rank),
         world_link, qwen),
        (f"ours, fp32 reduce, {batch}", _ours_on_l4(tokens_per_step, seq_len, "fp32"), hsdp_link,
         qwen),
        (f"ours, bf16 reduce, {batch}", ours_bf16, hsdp_link, qwen),
        ("ours, bf16 reduce, one micro-batch per step",
         StepPlan(**{**asdict(ours_bf16), "grad_accum": 1}), hsdp_link, qwen),
        *((name, plan, hsdp_link, chosen)
          for name, plan, chosen in _lora_on_l4(tokens_per_step, seq_len, lora_model)),
    ]
    return [_predicted(name, plan, links, chosen, rate) for name, plan, links, chosen in plans]


def _predicted(name: str, plan: StepPlan | str, links: Links, chosen: dict, rate: float) -> dict:
    """One preset row: the plan's prediction at `rate` FLOP/s, or why it does not fit. Its
    compute is the job's FLOPs per token for `chosen["model"]` (the count its MFU uses)."""
    if isinstance(plan, str):
        return {"name": name, "fits": False, "why": plan}
    from training.model.model import model_config

    fpt = model_flops_per_token(model_config(chosen["model"]), plan.params, plan.seq_len,
                                plan.trainable)
    pred = predict(plan, compute_s(plan, fpt, rate), links)
    return {"name": name, "fits": True, "plan": asdict(plan), **chosen, "flops_per_token": fpt,
            **asdict(pred), "steps_per_s": 1 / pred.step_s}


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
          f"inter-node {args.inter_gbps} GB/s (bus bandwidth); ours: the job's planner under "
          f"{L4_BUDGET_GIB} GiB per L4, HSDP {L4_NODES}x{L4_PER_NODE}, fp32 reduce unless said")
    print(f"{'plan':<52} {'mb x acc':>8} {'ZeRO':>4} {'step s':>7} {'steps/s':>8} "
          f"{'exposed s':>9} {'tok/s/GPU':>10}")
    for r in rows:
        if not r["fits"]:
            print(f"{r['name']:<52} {r['why']}")
            continue
        p = r["plan"]
        lora = (f"  checkpointing {'on' if p['checkpointing'] else 'off'}, loss chunk "
                f"{r['loss_chunk_tokens']:,}, estimate {r['estimate_gib']:.1f} GiB"
                if p["trainable"] else "")
        print(f"{r['name']:<52} {p['micro_batch']:>3} x {p['grad_accum']:<3} "
              f"{2 if p['zero2'] else 3:>4} {r['step_s']:>7.2f} {r['steps_per_s']:>8.3f} "
              f"{r['exposed_comm_s']:>9.2f} {r['tokens_per_s_per_gpu']:>10,.0f}{lora}")
    sample = rows[0]["steps_per_s"]
    print(f"check: the AWS sample's published {AWS_SAMPLE_STEPS_PER_S} steps/s on this hardware; "
          f"model {sample:.3f} ({sample / AWS_SAMPLE_STEPS_PER_S - 1:+.1%})")
    if (faster := lora_winner(rows)) is not None:
        print(f"LoRA ({args.lora_model}): {faster}")


def lora_winner(rows: list[dict]) -> str | None:
    """Which of the 7B LoRA plans that fit is predicted faster, and by how much (None: neither
    fits)."""
    fitting = sorted((r for r in rows if r["fits"] and r["plan"]["trainable"]),
                     key=lambda r: r["step_s"])
    if not fitting:
        return None
    if len(fitting) == 1:
        return f"only '{fitting[0]['name']}' fits"
    best, other = fitting[0], fitting[1]
    return (f"'{best['name']}' predicted faster, {other['step_s'] / best['step_s'] - 1:.1%} over "
            f"'{other['name']}'")


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
    ap.add_argument("--lora-model", default=LORA_MODEL, help="the built-in shape of the LoRA "
                    "recipe rows (another family's: llama3.1-8b, qwen3-8b, gemma3-12b, ...)")
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
                "compute_mfu", "intra_gbps", "inter_gbps", "tokens_per_step", "lora_model")},
                "rows": g6_predictions(args.compute_mfu, args.intra_gbps, args.inter_gbps,
                                       args.tokens_per_step, lora_model=args.lora_model)}
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
