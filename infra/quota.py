"""The account's On-Demand (and, with gpuCapacityType spot, Spot) vCPU quotas against what the
stack's nodes need, read at `pulumi up` before any resource exists: a run whose GPU nodes cannot
all launch would bill the ones that did while it waits for the rest.

- Need: each node group's nodes x their vCPUs, per quota (its capacity's, stack/catalog.py
  GpuCapacity: ON_DEMAND's, or SPOT's for a spot group: "All G and VT Spot Instance Requests"
  counts vCPUs too). A
  managed node group update first launches, per zone, up to two extra nodes (EKS user guide,
  managed-node-update-behavior, "Scale up phase": the larger of twice the zones and
  maxUnavailable, 1 by default): with a run going, the one-zone GPU group needs 2 more nodes, the
  two-zone system group up to 4. A spot group also launches a replacement for a node at
  elevated risk of a reclaim before that node is gone (EKS managed node groups enable Capacity
  Rebalancing for SPOT), one extra node per node at risk: counted for one (REBALANCE_NODES).
- Too little for the nodes themselves: a clear error with the numbers and the request command.
  Too little only for an update's surge: a warning (no run need go near it: docs/deploying.md, "Quota").
- Reservations: creating an On-Demand Capacity Reservation fails when "the requested quantity
  exceeds your On-Demand Instance limit for the selected instance family" (EC2 user guide,
  capacity-reservations-create): the quota was checked when it was made, and instances launched
  into it use that reserved capacity. Capacity Blocks are bought under their own limits (up to
  64 instances a block, 256 across blocks: EC2 user guide, capacity-blocks-purchase). Either
  way the GPU nodes need no On-Demand quota beyond the reservation: not checked.
- Access denied to Service Quotas: a warning with the command to check by hand, not a failure."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.node_groups import node_groups
from stack import catalog
from stack.config import StackConfig
from training.errors import InputError

SERVICE_CODE = "ec2"
SURGE_NODES_PER_ZONE = 2  # managed-node-update-behavior: "up to twice the number of AZs"
REBALANCE_NODES = 1  # a spot group's replacement launched beside a node about to be reclaimed


class QuotaError(InputError):
    """The account's quota cannot hold the stack's nodes: every shortfall, with its fix."""


@dataclass(frozen=True)
class QuotaNeed:
    """vCPUs the stack's nodes need from one quota: `nodes` itself, `surge` more during a node
    group update; `what` names the config keys behind them."""

    quota: catalog.ServiceQuota
    nodes: int
    surge: int
    what: str


def quota_needs(cfg: StackConfig) -> list[QuotaNeed]:
    """Per quota, the vCPUs of this stack's own node groups (none on an existing cluster) whose
    nodes launch on demand (infra/node_groups.py: the GPU nodes only when a run is deployed and
    they launch on demand, not into a reservation)."""
    if cfg.existing_cluster_name:
        return []
    needs: dict[str, QuotaNeed] = {}
    for group in node_groups(cfg):
        quota = group.vcpu_quota()
        if quota is None:
            continue
        vcpus = group.facts.vcpus
        surge = SURGE_NODES_PER_ZONE * group.zones * vcpus  # the documented upper bound
        if group.bought_as is catalog.SPOT:
            surge += REBALANCE_NODES * vcpus
        what = f"{group.count_key} {group.nodes} x {group.instance_type}"
        old = needs.get(quota.code)
        needs[quota.code] = QuotaNeed(
            quota, group.nodes * vcpus + (old.nodes if old else 0),
            surge + (old.surge if old else 0), f"{old.what} and {what}" if old else what)
    return list(needs.values())


def _command(need: QuotaNeed, region: str, request: bool) -> str:
    """The AWS CLI command that asks for enough (`request`) or reads the quota."""
    action = "request-service-quota-increase" if request else "get-service-quota"
    desired = f" --desired-value {need.nodes + need.surge}" if request else ""
    return (f"aws service-quotas {action} --service-code {SERVICE_CODE} "
            f"--quota-code {need.quota.code}{desired} --region {region}")


def verdict(need: QuotaNeed, value: float, region: str) -> tuple[str | None, str | None]:
    """(error, warning) for a quota of `value` vCPUs; None where it holds."""
    where = (f"{need.quota.name} ({SERVICE_CODE} {need.quota.code}) in {region} is "
             f"{value:g} vCPUs")
    ask = f"ask for more: {_command(need, region, request=True)}"
    if value < need.nodes:
        return (f"{need.what}: {need.nodes} vCPUs needed, but the quota {where} (instances of "
                f"these families already running count against it too). Lower the count, or "
                f"{ask} ({need.nodes + need.surge} also covers a node group update during a run)"),\
            None
    if value < need.nodes + need.surge:
        return None, (f"{need.what}: the quota {where}: enough for the nodes ({need.nodes}), "
                      f"not for the {need.surge} more of a node group update while they run; "
                      f"update only with no run going, or {ask}")
    return None, None


def _denied(error: Exception) -> bool:
    """Service Quotas' AccessDeniedException as the aws provider reports it."""
    return "AccessDenied" in str(error) or "not authorized to perform" in str(error)


def check_quotas(cfg: StackConfig) -> None:
    """Read each needed quota (aws.servicequotas.get_service_quota: the applied value, else the
    default) and raise QuotaError listing every shortfall; warn where it cannot be read."""
    errors = []
    for need in quota_needs(cfg):
        try:
            quota = aws.servicequotas.get_service_quota(service_code=SERVICE_CODE,
                                                        quota_code=need.quota.code)
        except Exception as error:  # a failed invoke raises a plain Exception with its text
            if not _denied(error):
                raise
            pulumi.log.warn(f"{need.what}: cannot read the {need.quota.name} quota (Service "
                            f"Quotas access denied); the nodes need {need.nodes} vCPUs of it "
                            f"({need.nodes + need.surge} during a node group update). Check it: "
                            f"{_command(need, cfg.region, request=False)}")
            continue
        error, warning = verdict(need, quota.value, cfg.region)
        if error:
            errors.append(error)
        if warning:
            pulumi.log.warn(warning)
    if errors:
        raise QuotaError("vCPU quota too small (nothing was created):\n"
                         + "\n".join(f"  - {e}" for e in errors))
