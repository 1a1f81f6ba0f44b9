"""Where a training step's GPU time goes: a torch profiler trace and a per-category breakdown.

The benchmark's answer to "what is left" when a target is missed: matmul, attention, other
(elementwise, norms, casts, optimizer), communication kernels and how much of them is exposed,
and the time the GPU sat idle waiting for the CPU to queue work.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from training.network.device_time import summarize


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
        for micro in batches:
            step(micro)
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
