"""What the evaluation after the export cost: its seconds on every GPU node the run's workers
hold, at the GPU instance's on-demand price (world's nodes x USD per hour x seconds / 3600, the
cold start's GPU-node dollars the same way: training/head/cold_start.py).

Two halves, because the two facts live in different processes. The workers count the nodes
(`world_nodes`, every rank, after the export): each Ray worker pod takes a whole GPU node
(workloads/raycluster.py), so the distinct hosts of the process group are the GPU nodes billed.
The price reaches only the head pod (GPU_NODE_USD_PER_HOUR, from stack/catalog.py:
workloads/scaleup_watch.py), where the driver completes the summary (`summary_usd`); a local run
has no price and gets None."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from training.head.cold_start import price_here
from training.run.handoff import RunSummary


def world_nodes() -> int:
    """Collective: how many hosts the process group's ranks run on (1 without a group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return 1
    hosts: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return len(set(hosts))


def gpu_node_usd(seconds: float | None, nodes: int | None,
                 usd_per_hour: float | None) -> float | None:
    """`nodes` GPU nodes held for `seconds` at `usd_per_hour` each; None when any is unknown."""
    if seconds is None or nodes is None or usd_per_hour is None:
        return None
    return round(nodes * usd_per_hour * seconds / 3600, 4)


def summary_usd(summary: RunSummary, env: Mapping[str, str] = os.environ) -> float | None:
    """The driver's half: the evaluation's dollars from rank 0's summary and the head's price."""
    return gpu_node_usd(summary.harness_s, summary.harness_nodes, price_here(env))
