"""`python -m bench.harness_time`: seconds per 100 examples of the shipped lm-eval task on one GPU
for a built-in shape at random init (the GPU machine has no internet: no weights, a local task),
the number docs/evaluation.md's cost estimate takes. Prints one JSON line."""

from __future__ import annotations

import argparse
import json
import time

import torch


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.harness_time",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--limit", type=int, default=100)
    return ap


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM

    from training.config import TrainConfig
    from training.evals import harness, shipped_task
    from training.model.model import model_config
    from training.run.export import bytes_tokenizer

    args = build_parser().parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_config(model_config(args.model, 257), dtype=dtype)
    model = model.to(device).eval()
    cfg = TrainConfig(harness_tasks=str(shipped_task.TASK_DIR), harness_limit=args.limit,
                      export=True, data="x.jsonl")
    lm = harness.ranked(model, bytes_tokenizer())
    started = time.perf_counter()
    results = harness.score(lm, cfg)
    seconds = time.perf_counter() - started
    print(json.dumps({"model": args.model, "device": str(torch.cuda.get_device_name(device))
                      if device.type == "cuda" else "cpu", "examples": args.limit,
                      "seconds": seconds, "s_per_100": seconds * 100 / args.limit,
                      "acc": results["instructions_mc"]["acc,none"]}))


if __name__ == "__main__":
    main()
