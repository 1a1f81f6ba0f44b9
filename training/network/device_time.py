"""Where a training step's GPU time goes, from the torch profiler's device kernels.

Categories (matmul, attention, communication, other), the communication time during which no
compute kernel ran (exposed), and the time the GPU sat idle. The job profiles one step with it to
report the exposed communication share (is the link the bottleneck?); the benchmark
(`bench/step_profile.py`) writes and summarizes whole traces.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

# What the job reports about its links (warm-up probe, one profiled step), in metrics and summary.
LINK_FIELDS = ("allgather_busbw_gbps", "allreduce_busbw_gbps", "comm_share", "exposed_comm_share")

# Kernel name patterns (CUDA kernel names, as the profiler reports them), first match wins.
CATEGORIES: list[tuple[str, re.Pattern]] = [
    ("communication", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|attention", re.I)),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|cublas", re.I)),
]
OTHER = "other"


def category(kernel_name: str) -> str:
    return next((name for name, pattern in CATEGORIES if pattern.search(kernel_name)), OTHER)


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def _overlap_us(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time covered by both interval sets."""
    return _union_us(a) + _union_us(b) - _union_us(a + b)


def kernel_breakdown(kernels: list[tuple[str, float, float]], steps: int) -> dict:
    """Milliseconds per step by category from (name, start_us, end_us) of every device kernel.

    `window` is first kernel start to last kernel end; `idle` is the part of it in which no
    kernel ran (the GPU waited for the CPU); `exposed_communication` is communication time during
    which no compute kernel ran.
    """
    if not kernels:
        return {}
    per = {}
    for name, start, end in kernels:
        per.setdefault(category(name), []).append((start, end))
    compute = [iv for cat, ivs in per.items() if cat != "communication" for iv in ivs]
    comm = per.get("communication", [])
    window = max(e for _, _, e in kernels) - min(s for _, s, _ in kernels)
    ms = {cat: sum(e - s for s, e in ivs) / steps / 1000 for cat, ivs in per.items()}
    ms.update(window=window / steps / 1000,
              idle=(window - _union_us(compute + comm)) / steps / 1000,
              exposed_communication=(_union_us(comm) - _overlap_us(comm, compute)) / steps / 1000)
    return {k: round(v, 2) for k, v in sorted(ms.items())}


def trace_kernels(trace: dict) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of the device work in a Chrome trace: kernels, copies, memsets.
    GPU-side annotations (FSDP's and NCCL's ranges) are left out: they overlap the kernels."""
    return [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def summarize(trace: dict, steps: int) -> dict:
    """The per-step breakdown of a trace's device time and its 15 most expensive kernels."""
    kernels = trace_kernels(trace)
    top: dict[str, float] = {}
    for name, start, end in kernels:
        top[name] = top.get(name, 0.0) + (end - start) / steps / 1000
    return {"ms_per_step": kernel_breakdown(kernels, steps),
            "top_kernels_ms_per_step": {k[:120]: round(v, 2) for k, v in
                                        sorted(top.items(), key=lambda kv: -kv[1])[:15]}}


def profile_step(step, device) -> tuple[object, dict[str, float]]:
    """Run `step()` once under the profiler (device kernels only); return its result and the
    shares of the profiled window spent in communication and in exposed communication (none off
    GPU). For a user on EKS: a large exposed share means the link, not the GPUs, sets the pace."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return step(), {}
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        result = step()
        torch.cuda.synchronize(device)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d, "trace.json")
        prof.export_chrome_trace(str(path))
        ms = kernel_breakdown(trace_kernels(json.loads(path.read_text())), steps=1)
    if not ms.get("window"):
        return result, {}
    return result, {"comm_share": round(ms.get("communication", 0.0) / ms["window"], 4),
                    "exposed_comm_share": round(ms["exposed_communication"] / ms["window"], 4),
                    "profiled_step_ms": ms["window"]}


def link_report(info: dict) -> str:
    """One line for the job's log: the warm-up bandwidths and the profiled step's exposed share."""
    parts = [f"{name} {info[key]:.2f} GB/s" for name, key in
             (("all-gather bus bandwidth", "allgather_busbw_gbps"),
              ("all-reduce bus bandwidth", "allreduce_busbw_gbps")) if info.get(key) is not None]
    if info.get("exposed_comm_share") is not None:
        parts.append(f"exposed communication {info['exposed_comm_share']:.0%} of a step "
                     f"(communication {info['comm_share']:.0%})")
    return "link: " + ("; ".join(parts) if parts else "single worker, no collectives measured")
