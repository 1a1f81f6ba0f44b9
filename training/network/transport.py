"""The job-side NCCL guard and EFA preflight, run inside every Ray Train worker.

NCCL opens its debug log on its first call, and PyTorch creates NCCL communicators lazily, so
pointing NCCL_DEBUG_FILE at a per-process file inside the train function (before any collective)
captures this process's lines. A warm-up all-reduce then makes NCCL choose and connect its
transport; every rank parses its own log, the facts are gathered, and all ranks reach the same
verdict, so they fail (or continue) together.
"""

from __future__ import annotations

import glob
import os
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from training.network import nccl

NOT_USED = "not-used"  # gloo (CPU): NCCL carried nothing, so there is nothing to classify


class TransportError(RuntimeError):
    """NCCL is not using the transport the job expects."""


@dataclass(frozen=True)
class TransportResult:
    verdict: str
    nodes: int | None
    message: str | None  # set when the verdict is a problem


def capture_nccl_log(rank: int) -> Path | None:
    """Route this process's NCCL INFO log to a file; call before the first collective."""
    if not torch.cuda.is_available():
        return None
    log_dir = Path(tempfile.gettempdir(), "nccl-logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"nccl.rank{rank}.pid{os.getpid()}.log"
    if os.environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        os.environ["NCCL_DEBUG"] = "INFO"
    os.environ["NCCL_DEBUG_FILE"] = str(path)
    return path


def check_transport(log_path: Path | None, device: torch.device, expect: str,
                    on_fallback: str) -> TransportResult:
    """Collective: warm up NCCL, classify every rank's log, fail or warn on a bad verdict."""
    dist.all_reduce(torch.ones(1, device=device))
    if dist.get_backend() != "nccl" or log_path is None:
        return TransportResult(NOT_USED, None, None)
    torch.cuda.synchronize(device)
    facts = nccl.parse(log_path.read_text(errors="replace").splitlines()) if log_path.exists() \
        else nccl.Facts()
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, facts.to_json())
    merged = nccl.Facts()
    for f in gathered:
        merged = merged.merge(nccl.Facts.from_json(f))
    return decide(merged, expect, on_fallback)


def decide(facts: nccl.Facts, expect: str, on_fallback: str) -> TransportResult:
    """The verdict on all ranks' facts; raises on a fallback (or a miss of --expect-transport)
    unless `on_fallback` is `warn`."""
    report = nccl.report(facts)
    v = report["verdict"]
    problem = v == "socket-fallback" or not nccl.satisfies(v, expect)
    message = nccl.explain(v, facts) if problem else None
    if problem and on_fallback == "fail":
        raise TransportError(message)
    return TransportResult(v, report["nodes"], message)


def efa_preflight() -> list[str]:
    """Problems that make EFA unusable in this pod (empty when healthy); for --expect-transport efa.
    A locked-memory limit below unlimited is only warned about (see `memlock_warning`)."""
    problems = []
    if not glob.glob("/dev/infiniband/uverbs*"):
        problems.append("no /dev/infiniband/uverbs* device in this pod: the worker must request "
                        "`vpc.amazonaws.com/efa: 1` and the EFA device plugin must run on the node")
    fi_info = shutil.which("fi_info") or next(iter(glob.glob("/opt/amazon/efa/bin/fi_info")), None)
    if fi_info:
        probe = subprocess.run([fi_info, "-p", "efa", "-t", "FI_EP_RDM"], capture_output=True,
                               text=True, timeout=60)
        if probe.returncode != 0:
            problems.append(f"`fi_info -p efa` failed: {(probe.stderr or probe.stdout).strip()[:200]}"
                            " (EFA libraries or device missing)")
    if (warning := memlock_warning()) is not None:
        print(f"WARNING: {warning}", flush=True)  # once per worker; Ray folds the repeats
    return problems


def memlock_warning() -> str | None:
    """libfabric's EFA provider has no locked-memory check of its own (nothing in prov/efa/src reads
    RLIMIT_MEMLOCK); it registers memory through ibv_reg_mr, and its docs (prov/efa/docs/
    overview.md) advise raising the limit for its bounce buffers. Pinning fails only past the
    limit, so a limit earns a warning with the fix, not a failed job. The AL2023 EKS AMI gives
    containers only an RLIMIT_NOFILE (nodeadm/internal/containerd/base-runtime-spec.json)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return None
    return (f"locked-memory limit is {soft} bytes, not unlimited: EFA memory registrations beyond "
            "it fail. If NCCL reports registration errors, add an unlimited RLIMIT_MEMLOCK to the "
            "GPU nodes' containerd base runtime spec (nodeadm NodeConfig "
            "spec.containerd.baseRuntimeSpec.process.rlimits)")
