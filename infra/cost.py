"""Hourly cost of the stack from the one price table (stack/catalog.py): idle, and while a run
holds its GPU nodes (they exist only then: the autoscaler adds them for a run's pods). Each node
group is priced from its spec (infra/node_groups.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Mapping

from infra.node_groups import NodeGroupSpec, node_groups
from stack.catalog import KUBERNETES_RELEASES, region_prices
from stack.config import StackConfig


def control_plane_price(price: dict[str, float], kubernetes_version: str, today: date) -> float:
    """EKS bills the extended-support price once the version's standard support has ended."""
    ended = today > KUBERNETES_RELEASES[kubernetes_version].standard_support_end
    return price["eks-control-plane-extended" if ended else "eks-control-plane"]


def group_cost(group: NodeGroupSpec, nodes: int, price: dict[str, float]) -> dict[str, float]:
    """A group's nodes and their root volumes (storage, and throughput and IOPS above gp3's free
    baseline, sized for image pulls), keyed `<key>Nodes` etc.; an autoscaled group's carry
    `DuringRun`: its nodes exist only while a run holds them (root volumes go with them: delete
    on termination)."""
    suffix = "DuringRun" if group.autoscaled else ""
    return {
        f"{group.key}Nodes{suffix}": round(nodes * price[group.instance_type], 4),
        f"{group.key}RootVolumes{suffix}": round(nodes * group.root.storage_usd_per_hour(price), 4),
        f"{group.key}RootVolumePerformance{suffix}": round(
            nodes * group.root.performance_usd_per_hour(price), 4),
    }


@dataclass(frozen=True)
class HourlyCost:
    """USD per hour with no job (`idle`) and while a run holds its GPU nodes (`run`, the idle
    cost included), each line of them (`breakdown`, keyed as the hourlyCostBreakdown output),
    whether any of it is an estimate and where the prices come from."""

    idle: float
    run: float
    breakdown: Mapping[str, float]
    is_estimate: bool
    source: str


def hourly_cost(cfg: StackConfig, today: date) -> HourlyCost:
    """The control plane, NAT gateway and its public IPv4 address and the fixed node groups with
    no job; the autoscaled groups too while a run of `gpuNodeCount` GPU nodes is going. An
    existing cluster's own costs are not this stack's; the nodes its autoscaler adds for this
    stack's run are. An estimate where the Region has no prices of its own in the table, or
    where a group's capacity is priced at a guess (spot at its ceiling: `source` says why)."""
    price, estimate, source = region_prices(cfg.region)
    own = 1 if cfg.existing_cluster_name is None else 0
    idle, run = {}, {}
    for group in node_groups(cfg):
        nodes = group.nodes if group.autoscaled or own else 0
        (run if group.autoscaled else idle).update(group_cost(group, nodes, price))
        why = group.bought_as.price_estimate
        if why and nodes:
            estimate = True
            source += "; " + why.format(instance_type=group.instance_type, region=cfg.region)
    idle.update({
        "eksControlPlane": (control_plane_price(price, cfg.kubernetes_version, today)
                            if own else 0.0),
        "natGateway": own * price["nat-gateway"],
        "natPublicIpv4": own * price["public-ipv4"],
    })
    return HourlyCost(idle=round(sum(idle.values()), 4),
                      run=round(sum(idle.values()) + sum(run.values()), 4),
                      breakdown={**idle, **run}, is_estimate=estimate, source=source)
