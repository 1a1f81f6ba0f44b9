"""Who gets cluster-admin: the cluster's creator (EKS gives it an access entry) and, when it has
none yet, adminPrincipalArn. Decided from plain reads before `eks.Cluster` is declared:
pulumi-eks's `accessEntries` is a plain input (schema.json `"plain": true`), so it must be a
plain dict, never an Output (the Node side would iterate the Output object's own fields)."""

from __future__ import annotations

from typing import Mapping

import pulumi_aws as aws
import pulumi_eks as eks

from infra.lookups import found
from infra.policies import CLUSTER_ADMIN_POLICY_ARN
from stack.config import StackConfig

# pulumi-eks creates each `accessEntries` item as an aws.eks.AccessEntry with the item's fields,
# tags included (authenticationMode.ts, createAccessEntries: `{...accessEntry, clusterName}`).
# This tag tells the stack's own entry from one it did not make: the creator's, which EKS makes
# at cluster creation (bootstrapClusterCreatorAdminPermissions, cluster.ts) and which is no
# resource of the stack, or one made by hand.
OWN_ENTRY_TAG = "eks-ray-train/access-entry"
ENTRY_NAME = "admin"


def principal_key(arn: str) -> tuple[str, str, str]:
    """(account, role|user, name) of an IAM role/user ARN or an STS assumed-role ARN, without
    the IAM path: an SSO role's issuer ARN is role/aws-reserved/sso.amazonaws.com/<name>, while
    people usually write role/<name> (a role's or user's name is unique in its account)."""
    _, _, _, _, account, resource = arn.split(":", 5)
    kind, _, rest = resource.partition("/")
    if kind == "assumed-role":
        return account, "role", rest.split("/", 1)[0]
    return account, kind, rest.rsplit("/", 1)[-1]


def without_path(arn: str) -> str:
    """The same role or user ARN without its IAM path."""
    account, kind, name = principal_key(arn)
    return f"arn:{arn.split(':')[1]}:iam::{account}:{kind}/{name}"


def spellings(arn: str, caller_account: str) -> list[str]:
    """The ARNs an entry for this principal may be filed under (EKS matches principal ARNs
    exactly): as written, without the IAM path and, in the caller's own account, with the path
    IAM reports (iam:GetRole / iam:GetUser), which the creator's entry may carry."""
    account, kind, name = principal_key(arn)
    iam = None
    if account == caller_account:
        iam = found(lambda: aws.iam.get_role(name=name).arn if kind == "role"
                    else aws.iam.get_user(user_name=name).arn)
    return list(dict.fromkeys(a for a in (arn, without_path(arn), iam) if a))


def wants_admin_entry(admin_arn: str | None, deployer_arn: str, cluster_exists: bool,
                      entry_tags: Mapping[str, str] | None) -> bool:
    """Whether the stack declares an access entry for `admin_arn`. Before the cluster exists,
    the deployer is about to become its creator: an entry for the same principal would be a
    409 ResourceInUseException (pulumi/pulumi-eks#2373). Once it exists, what EKS holds decides,
    never who runs the program: no entry for the principal -> declare one; an entry this stack
    made (tagged OWN_ENTRY_TAG) -> keep declaring it, or Pulumi would delete it; any other entry
    (the creator's, or one made by hand) -> leave it alone. `entry_tags`: the tags of the
    principal's entry, None when it has none."""
    if not admin_arn:
        return False
    if not cluster_exists:
        return principal_key(admin_arn) != principal_key(deployer_arn)
    return entry_tags is None or OWN_ENTRY_TAG in entry_tags


def admin_access_entries(cfg: StackConfig) -> dict[str, eks.AccessEntryArgs]:
    """pulumi-eks `accessEntries` for the stack, from plain invokes only. The deployer's IAM
    role (with its path) comes from its assumed-role session (aws.iam.get_session_context, which
    calls iam:GetRole). A teammate's later `pulumi up` plans what the creator's did: the cluster
    exists then, so the decision reads the principal's entry in EKS, under each spelling of
    its ARN."""
    admin = cfg.admin_principal_arn
    if not admin:
        return {}
    caller = aws.get_caller_identity()
    deployer = aws.iam.get_session_context(arn=caller.arn).issuer_arn
    exists = found(lambda: aws.eks.get_cluster(name=cfg.name)) is not None
    tags = None
    if exists:
        for arn in spellings(admin, caller.account_id):
            entry = found(lambda: aws.eks.get_access_entry(cluster_name=cfg.name,
                                                           principal_arn=arn))
            if entry is not None:
                tags = dict(entry.tags or {})
                break
    if not wants_admin_entry(admin, deployer, exists, tags):
        return {}
    return {ENTRY_NAME: eks.AccessEntryArgs(
        principal_arn=admin, tags={**cfg.tags, OWN_ENTRY_TAG: ENTRY_NAME},
        access_policies={"cluster-admin": eks.AccessPolicyAssociationArgs(
            policy_arn=CLUSTER_ADMIN_POLICY_ARN, access_scope={"type": "cluster"})})}
