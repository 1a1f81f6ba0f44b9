"""Who gets cluster-admin: the cluster's creator (EKS gives it an access entry) and, unless it is
that creator or already had an entry, adminPrincipalArn. Decided before `eks.Cluster` is declared:
pulumi-eks's `accessEntries` is a plain input (schema.json `"plain": true`), so it must be a
plain dict, never an Output (the Node side would iterate the Output object's own fields).

Whether the stack owns the admin's entry is decided once, on the first update that sees the
principal, and kept in the stack's state by a `pulumi.Stash`: EKS cannot say it later, since the
aws provider's access-entry data source returns no tags (terraform-provider-aws
access_entry_datasource.go has no @Tags annotation; hashicorp/terraform-provider-aws#45867), so a
decision read from EKS would drop the stack's own entry on every second update."""

from __future__ import annotations

import hashlib

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
from pulumi.runtime.sync_await import _sync_await

from infra.lookups import found
from infra.policies import CLUSTER_ADMIN_POLICY_ARN
from stack.config import StackConfig

# pulumi-eks creates each `accessEntries` item as an aws.eks.AccessEntry with the item's fields,
# tags included (authenticationMode.ts, createAccessEntries: `{...accessEntry, clusterName}`):
# the stack's own entry carries this tag for people reading the console (nothing reads it back).
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


def wants_admin_entry(admin_arn: str, deployer_arn: str, cluster_exists: bool,
                      has_entry: bool) -> bool:
    """Whether the stack should own an access entry for `admin_arn`, judged from what exists now
    (the first update that sees the principal; later ones keep that answer, `owned_entry`).
    Before the cluster exists the deployer is about to become its creator: an entry for the same
    principal would be a 409 ResourceInUseException (pulumi/pulumi-eks#2373). Once it exists,
    an entry the principal already has (the creator's, or one made by hand) is left alone;
    without one, the stack makes it."""
    if not cluster_exists:
        return principal_key(admin_arn) != principal_key(deployer_arn)
    return not has_entry


def owned_entry(name: str, admin_arn: str, decided_now: bool,
                parent: pulumi.Resource | None = None) -> bool:
    """The decision of the first update that saw this principal. A Stash per principal (by
    account, kind and name) keeps it: the engine's builtin provider sets its output to its input
    on create and keeps the old output on every later update and refresh
    (pkg/resource/deploy/builtins.go), a preview included, and the Stash is created before the
    cluster, so a failed first update keeps the answer too. Read here as a plain value, pumping
    the event loop as the SDK's plain invokes do (pulumi/runtime/invoke.py `invoke`)."""
    digest = hashlib.sha256("/".join(principal_key(admin_arn)).encode()).hexdigest()[:8]
    stash = pulumi.Stash(f"{name}-admin-entry-{digest}", input=admin_arn if decided_now else "",
                         opts=pulumi.ResourceOptions(parent=parent))
    kept = _sync_await(stash.output.future())
    return decided_now if kept is None else bool(kept)


def admin_access_entries(cfg: StackConfig, name: str = "eks",
                         parent: pulumi.Resource | None = None) -> dict[str, eks.AccessEntryArgs]:
    """pulumi-eks `accessEntries` for the stack. The deployer's IAM role (with its path) comes
    from its assumed-role session (aws.iam.get_session_context, which calls iam:GetRole); the
    principal's entry is looked up under each spelling of its ARN. Only the first update that
    sees the principal decides from these reads; a teammate's later `pulumi up` plans what the
    stack's state says."""
    admin = cfg.admin_principal_arn
    if not admin:
        return {}
    caller = aws.get_caller_identity()
    deployer = aws.iam.get_session_context(arn=caller.arn).issuer_arn
    exists = found(lambda: aws.eks.get_cluster(name=cfg.name)) is not None
    has_entry = exists and any(
        found(lambda arn=arn: aws.eks.get_access_entry(cluster_name=cfg.name, principal_arn=arn))
        is not None for arn in spellings(admin, caller.account_id))
    if not owned_entry(name, admin, wants_admin_entry(admin, deployer, exists, has_entry),
                       parent):
        return {}
    return {ENTRY_NAME: eks.AccessEntryArgs(
        principal_arn=admin, tags={**cfg.tags, OWN_ENTRY_TAG: ENTRY_NAME},
        access_policies={"cluster-admin": eks.AccessPolicyAssociationArgs(
            policy_arn=CLUSTER_ADMIN_POLICY_ARN, access_scope={"type": "cluster"})})}
