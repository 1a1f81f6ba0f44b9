"""Where a training step's GPU time goes: a torch profiler trace and a per-category breakdown.

The benchmark's answer to "what is left" when a target is missed: matmul, attention, other
(elementwise, norms, casts, optimizer), communication kernels and how much of them is exposed,
and the time the GPU sat idle waiting for the CPU to queue work.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

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


def profile_steps(step, batches, device, trace_path: Path) -> dict:
    """Run `step` over `batches` under the torch profiler; write a gzipped Chrome trace (open it in
    Perfetto) and return its summary."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for inputs, labels in batches:
            step(inputs, labels)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    raw = trace_path.with_suffix("")  # x.json.gz -> x.json: the profiler writes plain JSON only
    prof.export_chrome_trace(str(raw))
    text = raw.read_text()
    raw.unlink()
    with gzip.open(trace_path, "wt") as f:
        f.write(text)
    trace = json.loads(text)
    return {**summarize(trace, len(batches)), "trace": trace_path.name}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.step_profile",
                                 description="Summarize a benchmark trace (.json or .json.gz).")
    ap.add_argument("trace", type=Path)
    ap.add_argument("--steps", type=int, default=2, help="steps the trace holds")
    args = ap.parse_args(argv)
    data = args.trace.read_bytes()
    trace = json.loads(gzip.decompress(data) if args.trace.suffix == ".gz" else data)
    print(json.dumps(summarize(trace, args.steps), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
