"""Pure helpers for the network layout: subnet CIDRs and the two zones (the GPU zone first)."""

from __future__ import annotations

import ipaddress
from typing import Mapping

from training.config import InputError

# EKS refuses control-plane subnets in these zone IDs (EKS user guide, networking/network-reqs:
# "Subnet requirements for clusters"). Which zone *name* maps to them differs per account, so the
# check goes by zone ID. Local Zones are refused too; they are kept out by the opt-in-status filter.
EKS_UNSUPPORTED_ZONE_IDS = frozenset({"use1-az3", "usw1-az2", "cac1-az3"})
# `get_availability_zones` also returns opted-in Local Zones (us-west-2-lax-1a sorts before
# us-west-2a); regular zones are the ones that need no opt-in.
REGULAR_ZONES_FILTER = {"name": "opt-in-status", "values": ["opt-in-not-required"]}


class NetworkError(InputError):
    """No usable availability zone for the GPU node group."""


def subnet_cidrs(vpc_cidr: str, count: int) -> list[str]:
    """`count` equal, non-overlapping subnets: 16 slices of the VPC (a /16 gives /20s)."""
    net = ipaddress.ip_network(vpc_cidr)
    return [str(s) for s in list(net.subnets(prefixlen_diff=4))[:count]]


def choose_zones(configured: str | None, zone_ids: Mapping[str, str], gpu_offering: list[str],
                 system_offering: list[str], gpu_type: str, system_type: str) -> list[str]:
    """Two zones, the GPU zone first. Both hold control-plane subnets, so both must be regular
    zones whose IDs EKS accepts (`zone_ids`: name -> ID of the Region's regular zones, in AWS's
    order). The GPU zone is the configured one, else the first that offers the GPU type; the
    second is the first other zone that offers the system type (the system group spans both)."""
    usable = [z for z, zid in zone_ids.items() if zid not in EKS_UNSUPPORTED_ZONE_IDS]
    if configured:
        if configured not in zone_ids:
            raise NetworkError(f"gpuAvailabilityZone: {configured} is not an available regular zone "
                               f"of this Region (choose one of {', '.join(zone_ids)})")
        if configured not in usable:
            raise NetworkError(f"gpuAvailabilityZone: {configured} is zone ID {zone_ids[configured]}, "
                               "where EKS does not accept control-plane subnets; choose another zone")
        if configured not in gpu_offering:
            raise NetworkError(f"gpuAvailabilityZone: {configured} does not offer {gpu_type} "
                               f"(zones that do: {', '.join(sorted(gpu_offering)) or 'none'})")
        gpu_zone = configured
    else:
        candidates = [z for z in usable if z in gpu_offering]
        if not candidates:
            raise NetworkError(f"gpuInstanceType: no availability zone of this Region offers "
                               f"{gpu_type}; choose another Region (aws:region) or instance type")
        gpu_zone = candidates[0]
    others = [z for z in usable if z != gpu_zone and z in system_offering]
    if not others:
        raise NetworkError(f"systemInstanceType: EKS needs a second zone and none besides {gpu_zone} "
                           f"offers {system_type}; choose another system instance type or Region")
    return [gpu_zone, others[0]]
