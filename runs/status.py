"""What `list` and `show` say about a run, read from its RayJob (KubeRay 1.7.0's status fields:
jobDeploymentStatus, jobStatus, startTime, endTime) and its submitter's log (the job's step lines
and its last line, the JSON summary: training/driver/cli.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone

from training.head.cold_start import PRICE_ENV, parse_time

STEP = re.compile(r"step (\d+)/(\d+)\s+loss ([0-9.]+)")
FINISHED = {"SUCCEEDED": "succeeded", "FAILED": "failed", "STOPPED": "failed"}


@dataclass(frozen=True)
class Row:
    name: str
    state: str  # queued (N) / starting / running / succeeded / failed
    step: str
    loss: str
    started: str
    gpu_usd: str


def state(job: dict) -> str:
    """Queued while Kueue holds it suspended (KubeRay: Suspended, or not yet reconciled);
    starting until the Ray job runs; then the Ray job's own terminal status."""
    status = job.get("status") or {}
    deployment, ray = status.get("jobDeploymentStatus", ""), status.get("jobStatus", "")
    if deployment in ("Complete", "Failed"):
        return FINISHED.get(ray, "failed")
    if job["spec"].get("suspend") and deployment in ("", "New", "Suspended", "Initializing"):
        return "queued"
    return "running" if deployment == "Running" and ray == "RUNNING" else "starting"


def queue_positions(jobs: list[dict]) -> dict[str, int]:
    """1 for the next to start: the ClusterQueue is StrictFIFO (workloads/kueue.py), Kueue orders
    its workloads by creation time."""
    queued = sorted((j for j in jobs if state(j) == "queued"),
                    key=lambda j: j["metadata"].get("creationTimestamp", ""))
    return {j["metadata"]["name"]: i for i, j in enumerate(queued, start=1)}


def gpu_usd(job: dict, now: float) -> float | None:
    """The run's GPU nodes (its worker replicas) at the price its head was given, from admission
    (status.startTime, which KubeRay sets when Kueue unsuspends it) to its end or now: an upper
    bound, nodes bill from their launch a little later."""
    status, spec = job.get("status") or {}, job["spec"]["rayClusterSpec"]
    start = parse_time(status.get("startTime"))
    if start is None or state(job) == "queued":
        return None
    end = parse_time(status.get("endTime")) or now
    env = spec["headGroupSpec"]["template"]["spec"]["containers"][0].get("env", [])
    price = next((float(e["value"]) for e in env if e["name"] == PRICE_ENV), None)
    nodes = sum(g.get("replicas", 0) for g in spec.get("workerGroupSpecs", []))
    return None if price is None else round(nodes * price * max(0.0, end - start) / 3600, 2)


def progress(log: str) -> tuple[str, str]:
    """(step `n/total`, last loss) from the job's step lines, or dashes before the first."""
    found = STEP.findall(log)
    return (f"{found[-1][0]}/{found[-1][1]}", found[-1][2]) if found else ("-", "-")


def summary(log: str) -> dict | None:
    """The job's last JSON object line: its summary."""
    for line in reversed(log.splitlines()):
        text = line.strip()
        if text.startswith("{"):
            try:
                return json.loads(text)
            except json.JSONDecodeError:
                continue
    return None


def row(job: dict, position: int | None, log: str, now: float | None = None) -> Row:
    now = datetime.now(timezone.utc).timestamp() if now is None else now
    s = state(job)
    step, loss = progress(log)
    usd = gpu_usd(job, now)
    started = (job.get("status") or {}).get("startTime") if s != "queued" else None
    return Row(name=job["metadata"]["name"], state=f"queued ({position})" if position else s,
               step=step, loss=loss, started=started or "-",
               gpu_usd="-" if usd is None else f"{usd:.2f}")


def table(rows: list[Row]) -> str:
    head = ("NAME", "STATE", "STEP", "LOSS", "STARTED", "GPU USD")
    cells = [head, *((r.name, r.state, r.step, r.loss, r.started, r.gpu_usd) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()
                     for line in cells)
