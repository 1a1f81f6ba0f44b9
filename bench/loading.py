"""`python -m bench.loading`: load time and peak host memory of pretrained weights, both ways.

  every-rank:       each rank runs `from_pretrained` (fp32) and `fully_shard` keeps its shard
                    (the job's former way: a full host copy per GPU);
  rank0-broadcast:  the job's way (training/model/loading.py): rank 0 reads, the others build on the
                    meta device, `set_model_state_dict(broadcast_from_rank0=True)` shards.

Random weights of a built-in shape are saved first in bf16 (as the hub ships Qwen2.5), so no
download is needed. Each configuration (`--runs cuda:1,cpu:4`: device and ranks; CPU ranks talk
gloo, as 4 ranks of a g6.12xlarge node share its host memory) runs both ways in fresh processes.
Peak host RSS per rank is getrusage's high-water mark, which includes the process's imports
(reported alone as `baseline_rss_gib`). Writes one JSON file; `--table FILE` prints it as Markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

from bench.command import start

WAYS = ("every-rank", "rank0-broadcast")


def _rank(rank: int, world: int, port: int, device_type: str, way: str, model_dir: str,
          out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from training.model import loading
    from training.model.model import CausalLMWithLoss, build_model, model_config
    from training.step.parallelize import shard_model

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device_type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank,
                            world_size=world, device_id=device if device_type == "cuda" else None)
    config = model_config(model_dir)
    baseline = loading.host_rss_gib()
    dist.barrier()
    started = time.perf_counter()
    if way == "every-rank":
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32,
                                                  attn_implementation="sdpa")
        model = shard_model(CausalLMWithLoss(lm, 2048), device, reshard_after_forward=True,
                            activation_checkpointing=False)
    else:
        model = shard_model(CausalLMWithLoss(build_model(model_dir, config, seed=0), 2048),
                            device, reshard_after_forward=True, activation_checkpointing=False)
        loading.load_sharded(model, loading.rank0_state(model_dir, config, rank), device, started)
    if device_type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    result = {"load_s": time.perf_counter() - started, "peak_rss_gib": loading.host_rss_gib(),
              "baseline_rss_gib": baseline}
    Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _run(device_type: str, world: int, way: str, model_dir: str) -> dict:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(world, port, device_type, way, model_dir, out),
                           nprocs=world, start_method="spawn")
        ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(world)]
    return {"load_s": round(max(r["load_s"] for r in ranks), 2),
            "peak_rss_gib": [round(r["peak_rss_gib"], 2) for r in ranks],
            "node_peak_rss_gib": round(sum(r["peak_rss_gib"] for r in ranks), 2),
            "baseline_rss_gib": [round(r["baseline_rss_gib"], 2) for r in ranks]}


def save_random(shape: str, model_dir: str) -> int:
    """Random weights of a built-in shape, saved as the hub ships them (bf16 safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.model.model import count_params, model_config

    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        lm = AutoModelForCausalLM.from_config(model_config(shape), dtype=torch.bfloat16)
    lm.save_pretrained(model_dir)
    return count_params(lm)


def table(result: dict) -> str:
    rows = ["| device x ranks | way | load s | peak host RSS per rank (GiB) | node total GiB |",
            "|---|---|---|---|---|"]
    for run in result["runs"]:
        for way in WAYS:
            r = run[way]
            rows.append(f"| {run['device']} x {run['ranks']} | {way} | {r['load_s']} | "
                        f"{r['peak_rss_gib']} | {r['node_peak_rss_gib']} |")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.loading", description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="qwen2.5-1.5b", help="built-in shape to save and load")
    ap.add_argument("--runs", default="cuda:1,cpu:4", help="device:ranks,... to measure")
    ap.add_argument("--out", help="JSON result file")
    ap.add_argument("--table", metavar="JSON", help="print a saved result as Markdown and exit")
    return ap


def main(argv: list[str] | None = None) -> int:
    args, _ = start(build_parser(), argv)
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return 0
    import torch
    import transformers

    with tempfile.TemporaryDirectory(prefix="bench-load-") as model_dir:
        started = time.perf_counter()
        num_params = save_random(args.shape, model_dir)
        result = {"date": datetime.date.today().isoformat(), "command": sys.argv,
                  "shape": args.shape, "num_params": num_params,
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "python": platform.python_version(),
                  "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                  "save_s": round(time.perf_counter() - started, 1), "runs": []}
        for spec in args.runs.split(","):
            device_type, ranks = spec.split(":")
            run = {"device": device_type, "ranks": int(ranks)}
            for way in WAYS:
                run[way] = _run(device_type, int(ranks), way, model_dir)
                print(f"{spec} {way}: {run[way]}", flush=True)
            result["runs"].append(run)
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
