"""Refuse, before any resource, an update that would replace a node group while a run holds GPU
nodes: the replacement deletes the group's nodes under the run (the groups are
delete_before_replace, infra/cluster.py).

What replaces a managed node group: a change of any ForceNew argument of the aws provider's
aws_eks_node_group (terraform-provider-aws internal/service/eks/node_group.go: ami_type,
capacity_type, instance_types, subnet_ids, launch_template id, node_role_arn, ...). Of those the
stack config changes `capacity_type` (gpuCapacityType, a reservation or Capacity Block),
`instance_types` and `ami_type` (gpuInstanceType, systemInstanceType); they are compared here
with what EKS describes for the live group (eks:DescribeNodegroup, the data source
aws.eks.get_node_group). A change of zone is no change of the plan here: infra/network.py keeps
the zones of the subnets that exist."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi_aws as aws

from infra.lookups import found
from infra.node_groups import NodeGroupSpec, node_groups
from stack.config import ConfigError, StackConfig
from stack.kube import END_A_RUN

ON_DEMAND_EKS = "ON_DEMAND"  # what EKS reports for a group declared without a capacity type


@dataclass(frozen=True)
class LiveGroup:
    """A node group as EKS describes it when the program starts."""

    desired: int
    capacity_type: str
    instance_types: tuple[str, ...]
    ami_type: str


def live_group(cluster: str, group: str) -> LiveGroup | None:
    """None before the cluster or the group exists."""
    live = found(lambda: aws.eks.get_node_group(cluster_name=cluster, node_group_name=group))
    if not live or not live.scaling_configs:
        return None
    return LiveGroup(desired=live.scaling_configs[0].desired_size,
                     capacity_type=live.capacity_type or ON_DEMAND_EKS,
                     instance_types=tuple(live.instance_types or ()),
                     ami_type=live.ami_type or "")


def replaced_by(spec: NodeGroupSpec, live: LiveGroup) -> list[str]:
    """The config keys whose change replaces this group, with the change (old -> new)."""
    changes = []
    planned = spec.capacity_type or ON_DEMAND_EKS
    if planned != live.capacity_type:
        changes.append(f"{spec.key}CapacityType ({live.capacity_type} -> {planned})")
    # A Capacity Block names its instance type in the launch template only (no instance_types).
    if not spec.capacity_block and live.instance_types and \
            live.instance_types != (spec.instance_type,):
        changes.append(f"{spec.key}InstanceType ({','.join(live.instance_types)} -> "
                       f"{spec.instance_type})")
    elif live.ami_type and live.ami_type != spec.ami_type:
        changes.append(f"{spec.key}InstanceType (AMI type {live.ami_type} -> {spec.ami_type})")
    return changes


def refuse_replacement_during_run(cfg: StackConfig) -> None:
    """Raise ConfigError naming every change that would replace a node group while a run holds
    GPU nodes (an autoscaled group above 0 nodes), with how to end the run."""
    groups = [(spec, live_group(cfg.name, spec.name(cfg.name))) for spec in node_groups(cfg)]
    running = [(spec, live) for spec, live in groups if spec.autoscaled and live and live.desired]
    if not running:
        return
    problems = [f"{change}: replaces the node group {spec.name(cfg.name)}, deleting its nodes"
                for spec, live in groups if live for change in replaced_by(spec, live)]
    if problems:
        spec, live = running[0]
        raise ConfigError([
            f"{problem}, while the run's RayJob holds {live.desired} node(s) of "
            f"{spec.name(cfg.name)}. Let the run finish, or end it first ({END_A_RUN}), and "
            "run `pulumi up` again once the group is at 0 nodes (about 2 minutes after the run "
            "ends)"
            for problem in problems])
