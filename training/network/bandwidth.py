"""Warm-up bandwidth probe: what this run's collectives get on this cluster's links.

Times an all-gather within the shard group and an all-reduce across replicas (HSDP) with buffers
of the size of one decoder layer's collectives, and reports NCCL-tests' *bus bandwidth* (bytes a
rank moves over its link per second, independent of the group size: all-gather moves (n-1)/n of
the gathered bytes, all-reduce 2(n-1)/n; nccl-tests doc/PERFORMANCE.md). The step-time model
(`python -m bench.step_model`) takes these numbers as its link bandwidths.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from training.step.mesh import replicate_group, shard_group


def bus_factor(collective: str, n: int) -> float:
    """Bytes on a rank's link per byte of the collective's (gathered or reduced) buffer."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    return (n - 1) / n  # all_gather, reduce_scatter


def _seconds(fn, device: torch.device, iters: int) -> float:
    """Median seconds per call after one untimed call (connection set-up)."""
    times = []
    for i in range(iters + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def probe(mesh: DeviceMesh, device: torch.device, mib: int | None = None,
          iters: int = 5) -> dict[str, float | None]:
    """Bus bandwidth in GB/s of the shard group's all-gather and the replicas' all-reduce (None
    where the group has one rank). Every rank must call it. Default size: 64 MiB on GPU, 4 on CPU."""
    mib = mib or (64 if device.type == "cuda" else 4)
    nbytes = mib * 2**20
    out: dict[str, float | None] = {"allgather_busbw_gbps": None, "allreduce_busbw_gbps": None}
    group = shard_group(mesh)
    n = dist.get_world_size(group)
    if n > 1:
        full = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
        part = torch.ones(full.numel() // n, dtype=torch.bfloat16, device=device)
        full = full[:part.numel() * n]
        s = _seconds(lambda: dist.all_gather_into_tensor(full, part, group=group), device, iters)
        out["allgather_busbw_gbps"] = full.numel() * 2 * bus_factor("all_gather", n) / s / 1e9
    group = replicate_group(mesh)
    if group is not None and (n := dist.get_world_size(group)) > 1:
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        s = _seconds(lambda: dist.all_reduce(buf, group=group), device, iters)
        out["allreduce_busbw_gbps"] = nbytes * bus_factor("all_reduce", n) / s / 1e9
    return out
