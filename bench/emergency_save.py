"""`python -m bench.emergency_save`: how long one rank's checkpoint of a run of `--world` workers
takes, the part a preemption notice must cover (training/run/preemption.py).

One rank of the job holds, per FSDP2 (Shard(0) on dim 0 of each parameter), the first
ceil(rows / world) rows of every fp32 parameter and of both AdamW moments. This builds exactly
those shards of `--model` on this device, saves them with DCP into a local directory as the
job's synchronous save does (`training.run.checkpoint.save_local` -> `dcp.save`), and copies
the files to `--storage-path` as Ray Train's upload does (pyarrow `copy_files`; a local
directory here, or `s3://bucket/prefix` from a GPU node for the real upload). Each local
directory of `--local-dirs` is timed (the container's /tmp is the node's root volume, /dev/shm
is memory).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.command import start
from bench.single import environment, local_device, write_json

KIND = "emergency-save"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.emergency_save",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--world", type=int, default=8, help="workers the run shards over")
    ap.add_argument("--storage-path", default="/tmp/emergency-save-storage",
                    help="where the files go: a directory or s3://bucket/prefix")
    ap.add_argument("--local-dirs", default="/tmp,/dev/shm",
                    help="comma-separated directories to write the shards into first")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--json-out", type=Path, default=None)
    return ap


def rank_shards(model: str, world: int, device) -> dict:
    """Rank 0's state dict: its rows of every parameter, AdamW's two moments and step."""
    import torch
    from transformers import AutoModelForCausalLM

    from training.model.model import model_config

    with torch.device("meta"):
        shapes = {n: p.shape for n, p in
                  AutoModelForCausalLM.from_config(model_config(model)).named_parameters()}

    def shard(shape):
        return torch.randn((math.ceil(shape[0] / world), *shape[1:]), device=device)

    return {"model": {n: shard(s) for n, s in shapes.items()},
            "optim": {"state": {n: {"exp_avg": shard(s), "exp_avg_sq": shard(s),
                                    "step": torch.tensor(1.0)} for n, s in shapes.items()}}}


def time_save(shards: dict, local_root: str, storage: str) -> dict:
    """Seconds to write the shards into a fresh directory under `local_root` (device to host
    included) and to copy its files to `storage`; the bytes written."""
    import pyarrow.fs as pafs
    import torch
    import torch.distributed.checkpoint as dcp

    from training.storage import resolve

    target = resolve(storage)
    local = tempfile.mkdtemp(prefix="emergency-", dir=local_root)
    try:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        started = time.perf_counter()
        dcp.save(shards, checkpoint_id=local, no_dist=True)
        written = time.perf_counter()
        dest = f"{target.run_dir('emergency-save')}/{Path(local).name}"
        target.filesystem.create_dir(dest, recursive=True)
        pafs.copy_files(local, dest, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=target.filesystem)
        copied = time.perf_counter()
        size = sum(p.stat().st_size for p in Path(local).rglob("*") if p.is_file())
        target.filesystem.delete_dir(dest)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    return {"local_dir": local_root, "gib": size / 2**30, "write_s": written - started,
            "upload_s": copied - written, "total_s": copied - started,
            "upload_mib_per_s": size / 2**20 / (copied - written)}


def main(argv: list[str] | None = None) -> int:
    args, argv = start(build_parser(), argv)
    device = local_device()
    shards = rank_shards(args.model, args.world, device)
    runs = []
    for local_root in args.local_dirs.split(","):
        if not Path(local_root).is_dir():
            continue
        for _ in range(args.repeats):
            runs.append({"model": args.model, "world": args.world,
                         "storage_path": args.storage_path,
                         **time_save(shards, local_root, args.storage_path)})
            print(runs[-1], flush=True)
    write_json({"kind": KIND, "env": environment(device, argv, "bench.emergency_save"),
                "settings": {**vars(args), "json_out": str(args.json_out)}, "runs": runs},
               args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
