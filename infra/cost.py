"""Hourly cost of the stack from the one price table (stack/catalog.py)."""

from __future__ import annotations

from stack.catalog import PRICES_SOURCE, PRICES_USD_PER_HOUR
from stack.config import StackConfig


def hourly_cost(cfg: StackConfig) -> dict:
    """USD per hour while running, with its breakdown; GPU nodes cost nothing while paused."""
    price = PRICES_USD_PER_HOUR
    own_cluster = cfg.existing_cluster_name is None
    breakdown = {
        "gpuNodes": round(cfg.gpu_node_count * price[cfg.gpu_instance_type], 4),
        "systemNodes": round(cfg.system_node_count * price[cfg.system_instance_type], 4)
        if own_cluster else 0.0,
        "eksControlPlane": price["eks-control-plane"] if own_cluster else 0.0,
        "natGateway": price["nat-gateway"] if own_cluster else 0.0,
    }
    return {"hourlyCostUsd": round(sum(breakdown.values()), 4), "breakdown": breakdown,
            "source": PRICES_SOURCE}
