"""An ECR pull-through cache rule for ECR Public in the stack's Region, and what the nodes need to
make the first pull through it.

On the first pull of an image through the rule, ECR creates the cache repository and imports
the image from upstream on behalf of the puller, which needs `ecr:BatchImportUpstreamImage` and,
while the repository does not exist yet, `ecr:CreateRepository` (ECR user guide,
pull-through-cache-iam) besides the pull permissions of AmazonEC2ContainerRegistryReadOnly. The
node roles get exactly those, on this rule's repositories only. ECR Public needs no upstream
credentials (ECR user guide, pull-through-cache, supported upstream registries). A stack with
tags also grants them `ecr:TagResource` there: the template tags what their first pull creates.

ECR creates the cached repositories itself, so `pulumi destroy` deletes the rule but leaves them:
they are no resources of the stack. A repository creation template for the rule's prefix, applied
for PULL_THROUGH_CACHE, gives each of them, when ECR creates it, a lifecycle policy that bounds
its storage and the stack's tags (ECR user guide, repository-creation-templates; tags need a role
ECR assumes, repository-creation-templates-create-iam). README says how to delete them."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.policies import assume_role
from stack.config import StackConfig
from stack.images import ECR_PUBLIC, cache_prefix, cache_repository

# A cached image no node pulled for this many days expires; a later pull imports it again from
# ECR Public through the rule. Every run pulls the image it uses, so only images no run uses go.
UNPULLED_DAYS = 30


# The first pull through the rule imports the upstream image into, and creates, a repository
# (pull-through-cache-iam); ECR itself creates a tagged repository with the template's role
# (repository-creation-templates-custom, without the replication and KMS actions).
FIRST_PULL_ACTIONS = ("ecr:BatchImportUpstreamImage", "ecr:CreateRepository")
# Where a creation template adds resource tags, the ECR user guide (pull-through-cache-iam) lists
# ecr:TagResource for the principal whose pull creates the repository as well: without it the
# first pull of a tagged stack can be denied (ImagePullBackOff, no run starts).
TAGGING_ACTIONS = ("ecr:TagResource",)


def first_pull_actions(tagged: bool) -> tuple[str, ...]:
    """What a node role needs to make the first pull through the rule."""
    return FIRST_PULL_ACTIONS + (TAGGING_ACTIONS if tagged else ())
CREATION_ACTIONS = ("ecr:CreateRepository", "ecr:TagResource")


def repositories_policy(actions: tuple[str, ...], partition: str, region: str, account: str,
                        prefix: str) -> dict:
    """`actions` on the cache's repositories (under the rule's prefix) and nothing else."""
    return {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Action": list(actions),
        "Resource": f"arn:{partition}:ecr:{region}:{account}:repository/{prefix}/*"}]}


def _role_policy(name: str, role: aws.iam.Role, actions: tuple[str, ...], region: str,
                 prefix: str, opts: pulumi.ResourceOptions) -> aws.iam.RolePolicy:
    """The role's own ARN names the partition and account (the rule's registry_id too)."""
    return aws.iam.RolePolicy(name, role=role.name, policy=role.arn.apply(
        lambda arn: json.dumps(repositories_policy(actions, arn.split(":")[1], region,
                                                   arn.split(":")[4], prefix))), opts=opts)


def cache_lifecycle_policy() -> dict:
    """The lifecycle policy of every cache repository (ECR user guide, lifecycle_policy_examples:
    countType sinceImagePulled)."""
    return {"rules": [{
        "rulePriority": 1,
        "description": f"expire images no node pulled for {UNPULLED_DAYS} days",
        "selection": {"tagStatus": "any", "countType": "sinceImagePulled", "countUnit": "days",
                      "countNumber": UNPULLED_DAYS},
        "action": {"type": "expire"}}]}


class ImageCache(pulumi.ComponentResource):
    """`repository`: where images pulled through the rule live, resolved only once the rule and
    the node roles' permissions exist, so whatever pulls through it waits for both."""

    repository: pulumi.Output[str]

    def __init__(self, name: str, cfg: StackConfig, node_roles: list[aws.iam.Role],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("eksraytrain:infra:ImageCache", name, None, opts)
        prefix = cache_prefix(cfg.name)
        rule = aws.ecr.PullThroughCacheRule(
            f"{name}-ecr-public", ecr_repository_prefix=prefix, upstream_registry_url=ECR_PUBLIC,
            opts=pulumi.ResourceOptions(parent=self))
        actions = first_pull_actions(tagged=bool(cfg.tags))  # the template adds cfg.tags
        policies = [_role_policy(f"{name}-first-pull-{i}", role, actions, cfg.region,
                                 prefix, pulumi.ResourceOptions(parent=self))
                    for i, role in enumerate(node_roles)]
        template = self._creation_template(name, cfg, prefix)
        self.repository = pulumi.Output.all(
            rule.registry_id, template.id, *[p.id for p in policies]).apply(
                lambda values: cache_repository(values[0], cfg.region, prefix))
        self.register_outputs({"repository": self.repository})

    def _creation_template(self, name: str, cfg: StackConfig,
                           prefix: str) -> aws.ecr.RepositoryCreationTemplate:
        """Before the first pull, so the first repository gets it (it applies at creation only)."""
        child = pulumi.ResourceOptions(parent=self)
        role_arn = None
        if cfg.tags:
            role = aws.iam.Role(f"{name}-repository-creation",
                                assume_role_policy=json.dumps(assume_role("ecr.amazonaws.com")),
                                tags=dict(cfg.tags), opts=child)
            policy = _role_policy(f"{name}-repository-creation", role, CREATION_ACTIONS,
                                  cfg.region, prefix, child)
            role_arn = pulumi.Output.all(role.arn, policy.id).apply(lambda v: v[0])
        return aws.ecr.RepositoryCreationTemplate(
            f"{name}-repositories", prefix=prefix, applied_fors=["PULL_THROUGH_CACHE"],
            description=f"repositories of the {ECR_PUBLIC} pull-through cache of {cfg.name}",
            lifecycle_policy=json.dumps(cache_lifecycle_policy()),
            resource_tags=dict(cfg.tags) or None, custom_role_arn=role_arn, opts=child)
