"""Kubeconfig for an EKS cluster that authenticates with `aws eks get-token`."""

from __future__ import annotations

import json

import pulumi


def kubeconfig(name: str, endpoint: str, ca_data: str, region: str,
               profile: str | None = None) -> str:
    """With `profile`, the token comes from that AWS profile: the stack's `aws:profile` reaches
    the Kubernetes provider (Helm, custom resources) as it reaches the AWS provider. pulumi-eks's
    own `kubeconfig_json` omits it (cluster.ts: `kubeconfigWithoutProfile`) and passes
    `--profile` rather than AWS_PROFILE, which ambient credentials can override."""
    args = ["eks", "get-token", "--cluster-name", name, "--region", region]
    if profile:
        args += ["--profile", profile]
    return json.dumps(kubeconfig_dict(name, endpoint, ca_data, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws", "args": args}}))


def kubeconfig_dict(name: str, endpoint: str, ca_data: str, user: dict) -> dict:
    """One cluster, one user (its credential: an exec plugin, or a token), one context."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": endpoint,
                                                "certificate-authority-data": ca_data}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "users": [{"name": name, "user": user}],
    }


def kubeconfigs(name: pulumi.Input[str], endpoint: pulumi.Input[str], ca_data: pulumi.Input[str],
                region: str, profile: str | None) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """(for the Kubernetes provider: with the stack's profile; for people: without it), secret."""
    def build(p: str | None) -> pulumi.Output[str]:
        return pulumi.Output.secret(pulumi.Output.all(name, endpoint, ca_data).apply(
            lambda a: kubeconfig(a[0], a[1], a[2], region, p)))
    return build(profile), build(None)
