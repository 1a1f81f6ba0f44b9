"""Who gets cluster-admin: the cluster's creator (EKS gives it an access entry) and, when it is
someone else, adminPrincipalArn. The decision must not depend on who runs a later `pulumi up`."""

from __future__ import annotations

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks

from infra.policies import CLUSTER_ADMIN_POLICY_ARN

# Stack output naming the identity that created the cluster; later runs read it back.
CREATOR_OUTPUT = "clusterCreatorArn"


def cluster_creator() -> pulumi.Output[str]:
    """The IAM role or user that created this stack's cluster: this stack's own previous
    `clusterCreatorArn` output, read through a StackReference to the stack itself (a Pulumi
    maintainer's pattern, pulumi/pulumi#3722), else (first run, or a stack deployed before the
    output existed) the identity running `pulumi up` now. An assumed-role session maps to its role,
    with its path, through iam:GetRole (aws.iam.get_session_context)."""
    deployer = aws.iam.get_session_context(arn=aws.get_caller_identity().arn).issuer_arn
    own = pulumi.StackReference(
        f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}")
    return own.get_output(CREATOR_OUTPUT).apply(lambda previous: previous or deployer)


def principal_key(arn: str) -> tuple[str, str, str]:
    """(account, role|user, name) of an IAM role/user ARN or an STS assumed-role ARN, without
    the IAM path: an SSO role's issuer ARN is role/aws-reserved/sso.amazonaws.com/<name>, while
    people usually write role/<name> (a role's or user's name is unique in its account)."""
    _, _, _, _, account, resource = arn.split(":", 5)
    kind, _, rest = resource.partition("/")
    if kind == "assumed-role":
        return account, "role", rest.split("/", 1)[0]
    return account, kind, rest.rsplit("/", 1)[-1]


def admin_access_entries(admin_arn: str | None, creator_arn: str) -> dict:
    """pulumi-eks always creates the cluster with `bootstrapClusterCreatorAdminPermissions: true`
    (cluster/cluster.ts), so the creator already has a cluster-admin access entry; a second one
    for the same principal fails with 409 ResourceInUseException (pulumi/pulumi-eks#2373)."""
    if not admin_arn or principal_key(admin_arn) == principal_key(creator_arn):
        return {}
    return {"admin": eks.AccessEntryArgs(
        principal_arn=admin_arn,
        access_policies={"cluster-admin": eks.AccessPolicyAssociationArgs(
            policy_arn=CLUSTER_ADMIN_POLICY_ARN, access_scope={"type": "cluster"})})}
