"""Hourly cost of the stack from the one price table (stack/catalog.py): idle, and while a run
holds its GPU nodes (they exist only then: the autoscaler adds them for a run's pods)."""

from __future__ import annotations

from datetime import date

from infra.root_volumes import SYSTEM_ROOT, gpu_root
from stack.catalog import KUBERNETES_RELEASES, region_prices
from stack.config import StackConfig


def control_plane_price(price: dict[str, float], kubernetes_version: str, today: date) -> float:
    """EKS bills the extended-support price once the version's standard support has ended."""
    ended = today > KUBERNETES_RELEASES[kubernetes_version].standard_support_end
    return price["eks-control-plane-extended" if ended else "eks-control-plane"]


def hourly_cost(cfg: StackConfig, today: date) -> dict:
    """USD per hour with no job (control plane, NAT gateway and its public IPv4 address, system
    nodes and their root volumes) and while a run of `gpuNodeCount` GPU nodes is going (their
    root volumes go with them: delete on termination), with the breakdown. An existing
    cluster's own costs are not this stack's. `isEstimate`: the Region has no prices of its
    own in the table."""
    price, estimate, source = region_prices(cfg.region)
    own = 1 if cfg.existing_cluster_name is None else 0
    system = own * cfg.system_node_count
    idle = {
        "systemNodes": round(system * price[cfg.system_instance_type], 4),
        "systemRootVolumes": round(system * SYSTEM_ROOT.storage_usd_per_hour(price), 4),
        # Root volume throughput and IOPS above gp3's free baseline, sized for image pulls.
        "systemRootVolumePerformance": round(
            system * SYSTEM_ROOT.performance_usd_per_hour(price), 4),
        "eksControlPlane": (control_plane_price(price, cfg.kubernetes_version, today)
                            if own else 0.0),
        "natGateway": own * price["nat-gateway"],
        "natPublicIpv4": own * price["public-ipv4"],
    }
    gpu = gpu_root(cfg.root_volume_gib)
    run = {
        "gpuNodesDuringRun": round(cfg.gpu_node_count * price[cfg.gpu_instance_type], 4),
        "gpuRootVolumesDuringRun": round(cfg.gpu_node_count * gpu.storage_usd_per_hour(price), 4),
        "gpuRootVolumePerformanceDuringRun": round(
            cfg.gpu_node_count * gpu.performance_usd_per_hour(price), 4),
    }
    return {"idleUsdPerHour": round(sum(idle.values()), 4),
            "runUsdPerHour": round(sum(idle.values()) + sum(run.values()), 4),
            "breakdown": {**idle, **run}, "isEstimate": estimate, "source": source}
