"""Hourly cost of the stack from the one price table (stack/catalog.py): idle, and while a run
holds its GPU nodes (they exist only then: the autoscaler adds them for a run's pods)."""

from __future__ import annotations

from datetime import date

from stack.catalog import KUBERNETES_RELEASES, PRICES_SOURCE, PRICES_USD_PER_HOUR
from stack.config import StackConfig


def control_plane_price(kubernetes_version: str, today: date) -> float:
    """EKS bills the extended-support price once the version's standard support has ended."""
    ended = today > KUBERNETES_RELEASES[kubernetes_version].standard_support_end
    return PRICES_USD_PER_HOUR["eks-control-plane-extended" if ended else "eks-control-plane"]


def hourly_cost(cfg: StackConfig, today: date) -> dict:
    """USD per hour with no job (control plane, NAT gateway, system nodes) and while a run of
    `gpuNodeCount` GPU nodes is going, with the breakdown. An existing cluster's own costs are
    not this stack's."""
    price = PRICES_USD_PER_HOUR
    own_cluster = cfg.existing_cluster_name is None
    idle = {
        "systemNodes": round(cfg.system_node_count * price[cfg.system_instance_type], 4)
        if own_cluster else 0.0,
        "eksControlPlane": control_plane_price(cfg.kubernetes_version, today) if own_cluster else 0.0,
        "natGateway": price["nat-gateway"] if own_cluster else 0.0,
    }
    gpu = round(cfg.gpu_node_count * price[cfg.gpu_instance_type], 4)
    return {"idleUsdPerHour": round(sum(idle.values()), 4),
            "runUsdPerHour": round(sum(idle.values()) + gpu, 4),
            "breakdown": {**idle, "gpuNodesDuringRun": gpu}, "source": PRICES_SOURCE}
