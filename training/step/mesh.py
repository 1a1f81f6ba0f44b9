"""The device mesh FSDP2 shards over: plain FSDP across all workers, or HSDP.

HSDP (a 2-D mesh, replicate x shard) shards the model within each group of workers and replicates
it across groups: all-gathers and reduce-scatters stay inside a group, and only one gradient
all-reduce per optimizer step crosses groups. With one group per node that keeps the slow
inter-node link (one 40 Gbps EFA interface on g6.12xlarge) out of every collective but the
all-reduce. `fully_shard(mesh=2-D mesh)` is HSDP: "parameters are sharded across the 1st dim and
replicated across the 0th dim" (torch/distributed/fsdp/_fully_shard/_fully_shard.py, `mesh`).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from training.config import ConfigError


@dataclass(frozen=True)
class MeshLayout:
    """Ranks as rows of shard groups (one row per replica) and why this shape was chosen."""
    grid: tuple[tuple[int, ...], ...]
    reason: str

    @property
    def replicas(self) -> int:
        return len(self.grid)

    @property
    def shard_size(self) -> int:
        return len(self.grid[0])

    @property
    def shape(self) -> str:
        return f"{self.replicas}x{self.shard_size}"


def choose_layout(nodes: list[str], replicas: int | None) -> MeshLayout:
    """Lay out the ranks (`nodes[rank]` is the rank's node) as `replicas` shard groups.

    Ranks are ordered by node, then rank, so that each shard group stays on one node whenever the
    groups are no larger than a node. Default: one group per node when the run spans nodes that
    hold the same number of workers; plain FSDP (one group) otherwise. An explicit `replicas` wins.
    """
    world = len(nodes)
    order = {n: i for i, n in enumerate(dict.fromkeys(nodes))}
    ranks = sorted(range(world), key=lambda r: (order[nodes[r]], r))
    per_node = {n: nodes.count(n) for n in order}
    if replicas is not None:
        if replicas < 1 or world % replicas:
            raise ConfigError([f"--hsdp-replicas must divide the {world} workers (got {replicas})"])
        reason = "set by --hsdp-replicas"
    elif len(per_node) == 1:
        replicas, reason = 1, "one node: plain FSDP"
    elif len(set(per_node.values())) > 1:
        replicas, reason = 1, f"nodes hold unequal worker counts {sorted(per_node.values())}: plain FSDP"
    else:
        replicas, reason = len(per_node), "one replica per node: only the all-reduce crosses nodes"
    size = world // replicas
    grid = tuple(tuple(ranks[i * size:(i + 1) * size]) for i in range(replicas))
    return MeshLayout(grid, reason)


def build_mesh(replicas: int | None, device: torch.device) -> tuple[DeviceMesh, MeshLayout]:
    """The mesh for the default process group: 1-D for plain FSDP, (replicate, shard) for HSDP.
    Every rank learns every rank's node (its host name: one Ray worker pod per node)."""
    world = dist.get_world_size()
    nodes: list[str] = [""] * world
    dist.all_gather_object(nodes, socket.gethostname())
    layout = choose_layout(nodes, replicas)
    if layout.replicas == 1:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",)), layout
    return DeviceMesh(device.type, torch.tensor(layout.grid),
                      mesh_dim_names=("replicate", "shard")), layout


def shard_group(mesh: DeviceMesh) -> dist.ProcessGroup:
    return mesh.get_group("shard")


def replicate_group(mesh: DeviceMesh) -> dist.ProcessGroup | None:
    return mesh.get_group("replicate") if "replicate" in (mesh.mesh_dim_names or ()) else None
