"""Pure helpers for the network layout: subnet CIDRs and the two zones (the GPU zone first)."""

from __future__ import annotations

import ipaddress
from typing import Mapping

from training.errors import InputError

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
    order). The system node group spans both zones, so both must offer the system type. The GPU
    zone is the configured one, else the first that offers both types; the second is the first
    other zone that offers the system type."""
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
        if configured not in system_offering:
            raise NetworkError(f"gpuAvailabilityZone: {configured} does not offer the system node "
                               f"type {system_type}, whose node group spans both zones: choose "
                               f"another zone or systemInstanceType")
        gpu_zone = configured
    else:
        if not [z for z in usable if z in gpu_offering]:
            raise NetworkError(f"gpuInstanceType: no availability zone of this Region offers "
                               f"{gpu_type}; choose another Region (aws:region) or instance type")
        candidates = [z for z in usable if z in gpu_offering and z in system_offering]
        if not candidates:
            raise NetworkError(f"systemInstanceType: no zone that offers {gpu_type} also offers "
                               f"{system_type} (the system node group spans the GPU zone too); "
                               "choose another system instance type")
        gpu_zone = candidates[0]
    others = [z for z in usable if z != gpu_zone and z in system_offering]
    if not others:
        raise NetworkError(f"systemInstanceType: EKS needs a second zone and none besides {gpu_zone} "
                           f"offers {system_type}; choose another system instance type or Region")
    return [gpu_zone, others[0]]


def keep_zones(first: list[str], chosen: list[str], configured: str | None) -> list[str]:
    """The zones to deploy into, given those of the first deployment (`first`) and this run's
    choice (`chosen`, from choose_zones). A re-choice would move the subnets whenever AWS adds
    the GPU type to an earlier zone: a replacement with the same CIDR created before the old one
    is deleted, which EC2 refuses, and EKS refuses control-plane subnets outside the cluster's
    original zones. So the first zones stay; only a configured gpuAvailabilityZone that differs
    from them moves the GPU zone (the second zone stays unless it is the new GPU zone)."""
    gpu = configured or first[0]
    if gpu == first[0]:
        return list(first)
    return [gpu, first[1] if first[1] != gpu else chosen[1]]
