"""Target an existing EKS cluster: only add-ons and Ray workloads are deployed onto it."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.kubeconfig import kubeconfigs


def lookup(name: str, region: str, profile: str | None
           ) -> tuple[str, pulumi.Output[str], pulumi.Output[str]]:
    """(cluster name, kubeconfig for the Kubernetes provider, kubeconfig to export)."""
    cluster = aws.eks.get_cluster(name=name)
    return (cluster.name, *kubeconfigs(cluster.name, cluster.endpoint,
                                       cluster.certificate_authorities[0].data, region, profile))
