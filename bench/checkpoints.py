"""`python -m bench.checkpoints`: the real job's throughput with synchronous vs asynchronous
checkpoints (`--no-async-checkpoint` / `--async-checkpoint`), same shape, steps and saves.

Each mode is one fresh run of `python -m training` (through `training.driver.cli`, local Ray); the row
is its summary's `tokens_per_s` (steps only) and `tokens_per_s_with_checkpoints` (everything
since the first step began, saves included). Eager layers, so compile time stays out of both.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from bench.command import start
from bench.single import environment, local_device, write_json

KIND = "checkpoint"
MODES = {"sync": "--no-async-checkpoint", "async": "--async-checkpoint"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.checkpoints",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--num-workers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--storage-path", type=Path, default=Path("/tmp/ckpt-bench"))
    ap.add_argument("--json-out", type=Path, default=None)
    return ap


def job_flags(args: argparse.Namespace, mode: str) -> list[str]:
    return ["--model", args.model, "--seq-len", str(args.seq_len), "--micro-batch-size",
            str(args.micro_batch_size), "--num-workers", str(args.num_workers),
            "--steps", str(args.steps), "--checkpoint-every", str(args.checkpoint_every),
            "--log-every", str(args.checkpoint_every), "--data", "repeat", "--no-compile",
            "--warmup-steps", "0", "--on-fallback", "warn", "--storage-path",
            str(args.storage_path), "--name", f"ckpt-{mode}", MODES[mode]]


def main(argv: list[str] | None = None) -> int:
    from training.driver import cli

    args, argv = start(build_parser(), argv)
    import ray

    from training.driver.ray_setup import init_ray

    init_ray(None)  # one local Ray for both runs (cli.run joins it)
    runs = []
    try:
        for mode in MODES:
            flags = job_flags(args, mode)
            shutil.rmtree(args.storage_path / f"ckpt-{mode}", ignore_errors=True)
            summary = cli.run(cli.parse(flags))
            runs.append({"mode": mode, "steps": summary.steps,
                         "checkpoint_every": args.checkpoint_every,
                         "checkpoint_gib": summary.checkpoint_gib,
                         "run_tokens_per_s": summary.tokens_per_s,
                         "run_tokens_per_s_with_checkpoints":
                             summary.tokens_per_s_with_checkpoints,
                         "command": "python -m training " + " ".join(flags)})
            shutil.rmtree(args.storage_path / f"ckpt-{mode}", ignore_errors=True)  # small disk
            print(runs[-1], flush=True)
    finally:
        ray.shutdown()
    env = environment(local_device(), argv, "bench.checkpoints", args.num_workers)
    write_json({"kind": KIND, "env": env, "settings": vars(args) | {
        "storage_path": str(args.storage_path), "json_out": str(args.json_out)}, "runs": runs},
        args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
