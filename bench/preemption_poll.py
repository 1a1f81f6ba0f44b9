"""`python -m bench.preemption_poll`: what the job's per-step preemption check costs.

The trainer calls `Preemptions.poll()` at every step boundary (training/run/trainer.py) while
checkpoints are on. That is `ray.train.get_preemption_info()`, which in Ray 2.58 is
`collective_impl.broadcast_from_rank_zero`: every rank does a `ray.get` on Ray Train's
synchronization actor, which answers once all ranks have called (train/v2/_internal/execution/
train_fn_utils.py DistributedTrainFnUtils.get_preemption_info; collective_impl.py). Host work
only: no device sync, so on a GPU it can hide behind kernels already queued.

Two measurements, each in this process's one local Ray:
  calls  a Ray Train run of `--num-workers` workers (gloo on CPU, NCCL on GPUs) timing `--calls`
         polls per rank with perf_counter, beside as many torch.distributed barriers and
         one-float all_reduces for scale; median and p95 ms per call, slowest rank.
  job    the real job (`python -m training`) `--pairs` times with polls (--checkpoint-every past
         --steps: a poll every step, one save after the last, outside the timed steps) and
         without (--checkpoint-every 0), alternated A/B/A/B; the step time is the summary's
         tokens per step / tokens_per_s (the attempt's steps, warm-up and profiled window left
         out: training/run/progress.py StepClock). The 1-minute load average is recorded with
         each run: a shared CPU machine is noisy.
The JSON is rewritten after each measurement, so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench.command import refuse, start
from bench.single import environment, local_device, write_json

KIND = "preemption-poll"
WARMUP_CALLS = 5
PROBES = ("get_preemption_info", "dist.barrier", "all_reduce(1 float)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.preemption_poll",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--calls", type=int, default=300, help="timed calls of each probe per rank")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40, help="steps of each job run")
    ap.add_argument("--pairs", type=int, default=2,
                    help="job runs with and without polls, alternated; 0: calls only")
    ap.add_argument("--storage-path", type=Path, default=Path("/tmp/preemption-poll-bench"))
    ap.add_argument("--json-out", type=Path, default=None)
    return ap


def percentiles_ms(seconds: list[float]) -> dict[str, float]:
    """Median and p95 (nearest rank) of per-call times, in milliseconds."""
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"median_ms": statistics.median(ordered) * 1e3, "p95_ms": p95 * 1e3}


def _timed(call, calls: int) -> list[float]:
    for _ in range(WARMUP_CALLS):
        call()
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def poll_loop(config: dict) -> None:
    """Ray Train worker: each probe timed `calls` times on this rank; rank 0 reports every
    rank's percentiles (bench.benchmark's checkpointed report)."""
    import ray.train
    import torch
    import torch.distributed as dist

    from bench.benchmark import _report
    from training.run.preemption import Preemptions

    rank = ray.train.get_context().get_world_rank()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    one = torch.ones(1, device=device)

    def all_reduce() -> None:  # the round trip, not the enqueue: wait for the result
        dist.all_reduce(one)
        if cuda:
            torch.cuda.synchronize(device)

    probes = dict(zip(PROBES, (Preemptions(True, rank).poll, dist.barrier, all_reduce)))
    mine = {name: percentiles_ms(_timed(call, config["calls"])) for name, call in probes.items()}
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    _report(rank, {"ranks": ranks, "backend": dist.get_backend()})


def call_rows(args: argparse.Namespace) -> list[dict]:
    """One row per probe: the slowest rank's median and p95 ms per call."""
    import json

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.config import LoggingConfig

    from training.driver.ray_setup import torch_trainer

    use_gpu = ray.cluster_resources().get("GPU", 0) > 0
    trainer = torch_trainer()(poll_loop, train_loop_config={"calls": args.calls},
                              scaling_config=ScalingConfig(num_workers=args.num_workers,
                                                           use_gpu=use_gpu),
                              run_config=RunConfig(name="preemption-poll-calls",
                                                   storage_path=str(args.storage_path),
                                                   logging_config=LoggingConfig("WARNING")))
    with trainer.fit().checkpoint.as_directory() as d:
        measured = json.loads(Path(d, "bench.json").read_text())
    return [{"measured": name, "backend": measured["backend"], "workers": args.num_workers,
             "calls": args.calls,
             **{k: max(r[name][k] for r in measured["ranks"]) for k in ("median_ms", "p95_ms")}}
            for name in PROBES]


def job_flags(args: argparse.Namespace, polls: bool, name: str) -> list[str]:
    """The same job either way; only --checkpoint-every differs (past --steps: polls every
    step, saves once after the last; 0: no polls, no saves)."""
    return ["--model", args.model, "--seq-len", str(args.seq_len), "--micro-batch-size",
            str(args.micro_batch_size), "--num-workers", str(args.num_workers),
            "--steps", str(args.steps), "--data", "repeat", "--no-compile",
            "--warmup-steps", "0", "--on-fallback", "warn", "--no-async-checkpoint",
            "--checkpoint-every", str(args.steps + 1 if polls else 0),
            "--storage-path", str(args.storage_path), "--name", name]


def job_run(args: argparse.Namespace, polls: bool, pair: int) -> dict:
    """One run of the job: its step time from the summary, the load average around it."""
    from training.driver import cli

    name = f"poll-{'on' if polls else 'off'}-{pair}"
    flags = job_flags(args, polls, name)
    shutil.rmtree(args.storage_path / name, ignore_errors=True)  # the same name would resume
    load_before = os.getloadavg()[0]
    summary = cli.run(cli.parse(flags))
    shutil.rmtree(args.storage_path / name, ignore_errors=True)  # small disk
    tokens_per_step = (summary.micro_batch_size * summary.grad_accum * summary.world_size
                       * args.seq_len)
    return {"polls": polls, "pair": pair, "steps": summary.steps,
            "tokens_per_step": tokens_per_step, "tokens_per_s": summary.tokens_per_s,
            "step_time_ms": tokens_per_step / summary.tokens_per_s * 1e3,
            "loadavg_1m": [load_before, os.getloadavg()[0]],
            "command": "python -m training " + " ".join(flags)}


def pair_rows(runs: list[dict]) -> list[dict]:
    """Per pair: the step time with and without polls, their difference and its share of the
    step without them."""
    out = []
    for pair in sorted({r["pair"] for r in runs}):
        on = next((r for r in runs if r["pair"] == pair and r["polls"]), None)
        off = next((r for r in runs if r["pair"] == pair and not r["polls"]), None)
        if on and off:
            diff = on["step_time_ms"] - off["step_time_ms"]
            out.append({"pair": pair, "with_ms": on["step_time_ms"],
                        "without_ms": off["step_time_ms"], "difference_ms": diff,
                        "share": diff / off["step_time_ms"],
                        "loadavg_1m": [on["loadavg_1m"][0], off["loadavg_1m"][0]]})
    return out


def main(argv: list[str] | None = None) -> int:
    args, argv = start(build_parser(), argv)
    if args.num_workers < 1 or args.calls < 1 or args.pairs < 0:
        return refuse("--num-workers and --calls must be at least 1, --pairs at least 0")
    if args.pairs and args.steps < 10:  # steps 1 and 2..5 (profiled) are left out of the rate
        return refuse(f"--steps {args.steps}: at least 10 for a timed window past the warm-up")
    import ray

    from training.driver.ray_setup import init_ray

    started_here = not ray.is_initialized()
    if started_here:
        init_ray(None)
    result = {"kind": KIND, "settings": {**vars(args), "storage_path": str(args.storage_path),
                                         "json_out": str(args.json_out)},
              "env": environment(local_device(), argv, "bench.preemption_poll", args.num_workers),
              "calls": [], "runs": [], "pairs": []}
    try:
        result["calls"] = call_rows(args)
        print(result["calls"], flush=True)
        write_json(result, args.json_out)
        for pair in range(args.pairs):
            for polls in (True, False):
                result["runs"].append(job_run(args, polls, pair))
                result["pairs"] = pair_rows(result["runs"])
                print(result["runs"][-1], flush=True)
                write_json(result, args.json_out)
    finally:
        if started_here:
            ray.shutdown()
    print(result["pairs"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
