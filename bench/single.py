"""One process, one device, a real one-rank process group: the precision and memory benchmarks
build the job's engine exactly as a worker does (`training.step.engine.build_engine`) without Ray."""

from __future__ import annotations

import contextlib
import datetime
import json
import platform
import shlex
import socket
from pathlib import Path
from typing import Iterator

import torch
import torch.distributed as dist


def local_device() -> torch.device:
    """The device a one-process benchmark measures on: the first GPU, else the CPU (a CPU
    rehearsal of the same command)."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


@contextlib.contextmanager
def one_rank() -> Iterator[torch.device]:
    """A world-size-1 process group (NCCL on a GPU, gloo on CPU) around the block."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    device = local_device()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=0, world_size=1, device_id=device if cuda else None)
    try:
        yield device
    finally:
        dist.destroy_process_group()


def environment(device: torch.device, argv: list[str], prog: str, world_size: int = 1) -> dict:
    """Where and how a result was measured (the results file's provenance columns)."""
    import transformers

    cuda = device.type == "cuda"
    return {"gpu": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
            "world_size": world_size, "torch": torch.__version__,
            "transformers": transformers.__version__,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": f"python -m {prog} " + shlex.join(argv)}


def write_json(result: dict, path: Path | None) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2))


def device_peak(device: torch.device) -> dict:
    """The measured peak the memory planner is held to (none on CPU): `max_memory_reserved` plus
    the device memory outside torch's allocator (CUDA context, NCCL, kernels: `mem_get_info`'s
    used bytes less what torch has reserved); allocated is recorded too."""
    if device.type != "cuda":
        return {}
    gib = 2**30
    torch.cuda.synchronize(device)
    free, total = torch.cuda.mem_get_info(device)
    outside = total - free - torch.cuda.memory_reserved(device)
    out = {"peak_reserved_gib": torch.cuda.max_memory_reserved(device) / gib,
           "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / gib,
           "outside_torch_gib": outside / gib}
    out["peak_gib"] = out["peak_reserved_gib"] + out["outside_torch_gib"]
    return out
