"""An ECR pull-through cache rule for ECR Public in the stack's Region, and what the nodes need to
make the first pull through it.

On the first pull of an image through the rule, ECR creates the cache repository and imports
the image from upstream on behalf of the puller, which needs `ecr:BatchImportUpstreamImage` and,
while the repository does not exist yet, `ecr:CreateRepository` (ECR user guide,
pull-through-cache-iam) besides the pull permissions of AmazonEC2ContainerRegistryReadOnly. The
node roles get exactly those two, on this rule's repositories only. ECR Public needs no upstream
credentials (ECR user guide, pull-through-cache, supported upstream registries).

ECR creates the cached repositories itself, so `pulumi destroy` deletes the rule but leaves them
(and their storage bill): README says how to delete them."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from stack.config import StackConfig
from stack.images import ECR_PUBLIC, cache_prefix, cache_repository


def first_pull_policy(partition: str, region: str, account: str, prefix: str) -> dict:
    """Import an upstream image into, and create, the cache's repositories and nothing else."""
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow",
        "Action": ["ecr:BatchImportUpstreamImage", "ecr:CreateRepository"],
        "Resource": f"arn:{partition}:ecr:{region}:{account}:repository/{prefix}/*"}]}


class ImageCache(pulumi.ComponentResource):
    """`repository`: where images pulled through the rule live, resolved only once the rule and
    the node roles' permissions exist, so whatever pulls through it waits for both."""

    def __init__(self, name: str, cfg: StackConfig, node_roles: list[aws.iam.Role],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("eksraytrain:infra:ImageCache", name, None, opts)
        prefix = cache_prefix(cfg.name)
        rule = aws.ecr.PullThroughCacheRule(
            f"{name}-ecr-public", ecr_repository_prefix=prefix, upstream_registry_url=ECR_PUBLIC,
            opts=pulumi.ResourceOptions(parent=self))
        policies = [aws.iam.RolePolicy(
            f"{name}-first-pull-{i}", role=role.name,
            # The role's own ARN names the partition and account (the rule's registry_id too).
            policy=role.arn.apply(lambda arn: json.dumps(first_pull_policy(
                arn.split(":")[1], cfg.region, arn.split(":")[4], prefix))),
            opts=pulumi.ResourceOptions(parent=self)) for i, role in enumerate(node_roles)]
        self.repository: pulumi.Output[str] = pulumi.Output.all(
            rule.registry_id, *[p.id for p in policies]).apply(
                lambda values: cache_repository(values[0], cfg.region, prefix))
        self.register_outputs({"repository": self.repository})
