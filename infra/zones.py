"""Pure helpers for the network layout: subnet CIDRs and the GPU node group's single AZ."""

from __future__ import annotations

import ipaddress

from training.config import InputError


class NetworkError(InputError):
    """No usable availability zone for the GPU node group."""


def subnet_cidrs(vpc_cidr: str, count: int) -> list[str]:
    """`count` equal, non-overlapping subnets: 16 slices of the VPC (a /16 gives /20s)."""
    net = ipaddress.ip_network(vpc_cidr)
    return [str(s) for s in list(net.subnets(prefixlen_diff=4))[:count]]


def choose_zones(configured: str | None, offering: list[str], available: list[str],
                 instance_type: str) -> list[str]:
    """Two zones, the GPU zone first: the configured one, else the first available zone that
    offers the GPU instance type. EKS needs control-plane subnets in two zones."""
    if configured:
        if configured not in offering:
            raise NetworkError(f"gpuAvailabilityZone: {configured} does not offer {instance_type} "
                               f"(zones that do: {', '.join(sorted(offering)) or 'none'})")
        gpu_zone = configured
    else:
        candidates = [z for z in available if z in offering]
        if not candidates:
            raise NetworkError(f"gpuInstanceType: no availability zone of this Region offers "
                               f"{instance_type}; choose another Region (aws:region) or instance type")
        gpu_zone = candidates[0]
    others = [z for z in available if z != gpu_zone]
    if not others:
        raise NetworkError("aws:region: EKS needs two availability zones; this Region shows one")
    return [gpu_zone, others[0]]
