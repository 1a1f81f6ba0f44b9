"""Plain reads of what already exists in AWS, made before any resource is declared: the program
decides from them, so every plain input (pulumi-eks's included) gets a plain value."""

from __future__ import annotations

from typing import Callable, TypeVar

import pulumi_aws as aws

from infra.node_groups import LiveScaling
from training.errors import InputError

T = TypeVar("T")


def is_not_found(error: Exception) -> bool:
    """A failed invoke raises a plain Exception with the provider's text. terraform-provider-aws
    turns a ResourceNotFoundException into retry.NotFoundError, whose text is "couldn't find
    resource" (e.g. "reading EKS Add-On (cluster:addon): couldn't find resource")."""
    return "couldn't find resource" in str(error) or "ResourceNotFoundException" in str(error)


def found(read: Callable[[], T]) -> T | None:
    """`read()`, or None where AWS answers that the thing does not exist; other errors raise."""
    try:
        return read()
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a not-found answer
        if is_not_found(error):
            return None
        raise


def live_scaling(cluster: str, group: str) -> LiveScaling | None:
    """The node group's live scaling, None before the cluster or the group exists."""
    live = found(lambda: aws.eks.get_node_group(cluster_name=cluster, node_group_name=group))
    if not live or not live.scaling_configs:
        return None
    scaling = live.scaling_configs[0]
    return LiveScaling(desired=scaling.desired_size, max=scaling.max_size)


class PartitionError(InputError):
    """The Region is outside the aws partition."""


def require_aws_partition(region: str) -> None:
    """Refuse GovCloud, China and the other partitions before anything is declared: this
    stack's ARNs (the node roles' managed policies, the EKS cluster-admin access policy), its S3
    endpoint's service name and its image registry (ECR Public) are the aws partition's, and
    its prices are US prices. The partition is what the aws provider answers for the Region."""
    partition = aws.get_partition().partition
    if partition != "aws":
        raise PartitionError(
            f"aws:region: {region} is in the {partition} partition; this stack supports only "
            "Regions of the aws partition (its ARNs, endpoints and image registry are that "
            "partition's): choose one, e.g. `pulumi config set aws:region us-west-2`")
