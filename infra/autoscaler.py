"""cluster-autoscaler's AWS identity: a role only its service account can assume (Pod Identity)."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.policies import cluster_autoscaler, pod_identity_trust
from stack.config import StackConfig
from stack.kube import AUTOSCALER_NAMESPACE, AUTOSCALER_SERVICE_ACCOUNT


class AutoscalerIdentity(pulumi.ComponentResource):
    """The autoscaler's Helm release depends on `association`, so it starts with credentials."""

    association: aws.eks.PodIdentityAssociation  # its service account's role

    def __init__(self, name: str, cfg: StackConfig, cluster_name: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("eksraytrain:infra:AutoscalerIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(f"{name}-role", assume_role_policy=json.dumps(pod_identity_trust()),
                            tags=dict(cfg.tags), opts=child)
        policy = aws.iam.RolePolicy(f"{name}-policy", role=role.id,
                           policy=json.dumps(cluster_autoscaler(cfg.name)), opts=child)
        self.association = aws.eks.PodIdentityAssociation(
            f"{name}-identity", cluster_name=cluster_name, namespace=AUTOSCALER_NAMESPACE,
            service_account=AUTOSCALER_SERVICE_ACCOUNT, role_arn=role.arn, tags=dict(cfg.tags),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]))
        self.register_outputs({})
