"""Preemption notices the job handled, recorded in the run's storage as they happen (one file
each: a later attempt never overwrites an earlier one's), so the summary lists every drain of
the run's nodes across attempts: when, which nodes (Ray ids and Kubernetes names) and the step
saved. Why a node went (a repair, a spot reclaim) the driver adds on the head
(training/head/node_events.py)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

EVENTS_DIR = "node-events"


@dataclass(frozen=True)
class NodeEvent:
    """One handled drain: when (Unix seconds), which nodes (Ray ids, Kubernetes names) and the
    step saved."""
    time: float
    ray_nodes: tuple[str, ...]
    kube_nodes: tuple[str, ...]
    step_saved: int

    def to_dict(self) -> dict:
        return asdict(self)


def kube_nodes_of(ray_nodes: tuple[str, ...]) -> tuple[str, ...]:
    """Collective: the Kubernetes node names (each worker's NODE_NAME from the downward API, or
    its host name) of the Ray nodes given, gathered from every rank."""
    import ray
    import torch.distributed as dist

    from training.network.link_floor import node_name

    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (ray.get_runtime_context().get_node_id(), node_name()))
    names = dict(gathered)
    return tuple(dict.fromkeys(names[n] for n in ray_nodes if n in names))


def record(files, ray_nodes: tuple[str, ...], kube_nodes: tuple[str, ...], step: int) -> None:
    """Write the notice handled now to the run's storage (`files`: run_files.RunFiles)."""
    event = NodeEvent(time.time(), ray_nodes, kube_nodes, step)
    files.fs.create_dir(f"{files.run_dir}/{EVENTS_DIR}", recursive=True)
    files.write_json(f"{EVENTS_DIR}/{event.time:.3f}-{step}.json", event.to_dict())
