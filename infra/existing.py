"""Target an existing EKS cluster: only add-ons and Ray workloads are deployed onto it."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws


def kubeconfig(name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token` (the caller's AWS credentials)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": endpoint,
                                                "certificate-authority-data": ca_data}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "users": [{"name": name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", name, "--region", region]}}}],
    })


def lookup(name: str, region: str) -> tuple[str, pulumi.Output[str]]:
    cluster = aws.eks.get_cluster(name=name)
    return cluster.name, pulumi.Output.secret(
        kubeconfig(cluster.name, cluster.endpoint, cluster.certificate_authorities[0].data, region))
