"""How the benchmarks time work on the device: calls back to back as a training loop runs them
(CUDA events on a GPU, the host clock on CPU), and the GPU's measured bf16 matmul rate."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def back_to_back_seconds(calls: list[Callable[[], object]], device: torch.device) -> list[float]:
    """Seconds per call of `calls` (zero-argument functions) run back to back as a training loop
    runs them: no host sync in between, so the CPU queues call i+1 while the GPU runs call i.
    On GPU each call's end is a CUDA event and a call's time is the gap between consecutive ends
    (device-side); on CPU the host clock."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    marks = []

    def mark():
        if cuda:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        else:
            marks.append(time.perf_counter())

    mark()
    for call in calls:
        call()
        mark()
    if cuda:
        marks[-1].synchronize()
        return [a.elapsed_time(b) / 1000 for a, b in zip(marks, marks[1:])]
    return [b - a for a, b in zip(marks, marks[1:])]


def time_steps(step: Callable[[list], object], batches: list, warmup: int, steps: int,
               device: torch.device) -> list[float]:
    """Seconds per step for `steps` timed steps after `warmup` untimed ones; a batch is one
    optimizer step's list of micro-batches."""
    for micro in batches[:warmup]:
        step(micro)
    timed = batches[warmup:warmup + steps]
    return back_to_back_seconds([lambda m=micro: step(m) for micro in timed], device)


def matmul_tflops(device: torch.device) -> float | None:
    """Measured dense bf16 matmul rate on random data (8192^3, median of 20); None on CPU."""
    if device.type != "cuda":
        return None
    n = 8192
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(5):
        a @ b
    times = back_to_back_seconds([lambda: a @ b] * 20, device)
    return 2 * n**3 / statistics.median(times) / 1e12
