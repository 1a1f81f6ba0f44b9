"""Where the workers will run, learned from the Ray cluster once it is there and before Ray
Train starts them: each worker's node (the mesh the step is planned on) and a GPU's memory (the
limit it is planned within). The driver runs on a CPU-only head, so it asks a GPU node."""

from __future__ import annotations

from typing import Any


def worker_nodes(nodes: list[dict[str, Any]], kind: str, count: int) -> list[str]:
    """The node of each of `count` workers (`ray.nodes()` entries; one `kind`, GPU or CPU, per
    worker) as Ray Train's default placement puts them: its placement group's PACK strategy
    (ray.train.ScalingConfig.placement_strategy) fills as few nodes as possible, so the nodes
    with the most free slots first. Fewer slots than workers: the capacity check failed first."""
    slots = sorted(((int(n.get("Resources", {}).get(kind, 0)), n["NodeID"])
                    for n in nodes if n.get("Alive")), key=lambda s: -s[0])
    placed: list[str] = []
    for have, node in slots:
        placed += [node] * min(have, count - len(placed))
    return placed


def cluster_worker_nodes(use_gpu: bool, count: int) -> list[str]:
    import ray

    return worker_nodes(ray.nodes(), "GPU" if use_gpu else "CPU", count)


def gpu_memory_bytes() -> int:
    """One GPU's memory, as a worker will see it (torch.cuda on a GPU node): a one-GPU task,
    gone before Ray Train asks for every GPU."""
    import ray

    @ray.remote(num_gpus=1, num_cpus=0)
    def total_memory() -> int:
        import torch

        return torch.cuda.get_device_properties(0).total_memory

    return ray.get(total_memory.remote())
