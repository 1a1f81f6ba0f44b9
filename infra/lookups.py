"""Plain reads of what already exists in AWS, made before any resource is declared: the program
decides from them, so every plain input (pulumi-eks's included) gets a plain value."""

from __future__ import annotations

from typing import Callable, TypeVar

import pulumi_aws as aws

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


def node_group_desired_size(cluster: str, group: str) -> int | None:
    """The node group's live desired size (what cluster-autoscaler last set), None before the
    cluster or the group exists."""
    live = found(lambda: aws.eks.get_node_group(cluster_name=cluster, node_group_name=group))
    return live.scaling_configs[0].desired_size if live and live.scaling_configs else None
