"""Who gets cluster-admin: the cluster's creator (EKS gives it an access entry) and, unless it is
that creator or already had an entry of its own, adminPrincipalArn. Decided before `eks.Cluster`
is declared: pulumi-eks's `accessEntries` is a plain input (schema.json `"plain": true`), so it
must be a plain dict, never an Output (the Node side would iterate the Output object's own fields).

Decided on every update from the cluster as EKS holds it now, so the answer always belongs to the
cluster it is made for: a first update that failed before the cluster existed, a renamed or
replaced cluster or one deleted out of band is judged afresh (a decision kept in the stack's
state would outlive the cluster it was made for: an entry for whoever creates the next one is a
409, or the admin gets none). The stack recognises its own entry by its tag: the aws provider's
access-entry *data source* returns no tags (terraform-provider-aws access_entry_datasource.go has
no @Tags annotation; hashicorp/terraform-provider-aws#45867), but the *resource* Read sets them
(access_entry.go is `@Tags(identifierAttribute="access_entry_arn")`), so the entry is read as a
resource (`aws.eks.AccessEntry.get`). Stacks an older version created carry the same tag and keep
their entry on upgrade."""

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
# the stack's own entry carries this tag, read back on every update (entry_tags) to tell it
# from an entry of anyone else's.
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
                      entry_tags: dict[str, str] | None) -> bool:
    """Whether the stack should declare an access entry for `admin_arn`; `entry_tags`: the tags
    of the entry the principal has on the cluster now, None without one. Before the cluster
    exists the deployer is about to become its creator: an entry for the same principal would be
    a 409 ResourceInUseException (pulumi/pulumi-eks#2373). Once it exists, the stack's own
    (tagged) entry stays declared, an entry of anyone else's (the creator's, one made by hand)
    is left alone, and without one the stack makes it."""
    if not cluster_exists:
        return principal_key(admin_arn) != principal_key(deployer_arn)
    return entry_tags is None or OWN_ENTRY_TAG in entry_tags


def entry_tags(name: str, entry_id: str, parent: pulumi.Resource | None = None) -> dict[str, str]:
    """The tags of an existing access entry (id `cluster:principalArn`, the data source's id), by
    a resource Read, the only read that returns them. Read steps run in previews as well
    (pulumi/pulumi pkg/resource/deploy/step.go ReadStep.Apply: "Unlike most steps, Read steps run
    during previews"). Read as a plain value, pumping the event loop as the SDK's plain invokes
    do (pulumi/runtime/invoke.py `invoke`)."""
    digest = hashlib.sha256(entry_id.encode()).hexdigest()[:8]
    entry = aws.eks.AccessEntry.get(f"{name}-admin-entry-read-{digest}", entry_id,
                                    opts=pulumi.ResourceOptions(parent=parent))
    tags, tags_all = _sync_await(pulumi.Output.all(entry.tags, entry.tags_all).future())
    return {**(tags_all or {}), **(tags or {})}


def admin_access_entries(cfg: StackConfig, name: str = "eks",
                         parent: pulumi.Resource | None = None) -> dict[str, eks.AccessEntryArgs]:
    """pulumi-eks `accessEntries` for the stack. The deployer's IAM role (with its path) comes
    from its assumed-role session (aws.iam.get_session_context, which calls iam:GetRole); the
    principal's entry is looked up under each spelling of its ARN. Every update, whoever runs
    it, plans the same from what EKS holds."""
    admin = cfg.admin_principal_arn
    if not admin:
        return {}
    caller = aws.get_caller_identity()
    deployer = aws.iam.get_session_context(arn=caller.arn).issuer_arn
    exists = found(lambda: aws.eks.get_cluster(name=cfg.name)) is not None
    existing = next((entry for arn in spellings(admin, caller.account_id) if exists and (
        entry := found(lambda arn=arn: aws.eks.get_access_entry(cluster_name=cfg.name,
                                                                principal_arn=arn)))), None)
    tags = entry_tags(name, existing.id, parent) if existing else None
    if not wants_admin_entry(admin, deployer, exists, tags):
        return {}
    return {ENTRY_NAME: eks.AccessEntryArgs(
        principal_arn=admin, tags={**cfg.tags, OWN_ENTRY_TAG: ENTRY_NAME},
        access_policies={"cluster-admin": eks.AccessPolicyAssociationArgs(
            policy_arn=CLUSTER_ADMIN_POLICY_ARN, access_scope={"type": "cluster"})})}
