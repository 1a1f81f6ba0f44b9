"""The IAM policy the principal that runs `pulumi up` / `pulumi destroy` needs, generated from a
table: each AWS resource type and data source (invoke) token the program uses -> the API actions
the aws provider calls to create, read, update and delete it. No "*" action: every action is
named. `python -m stack.deployer_policy` prints the document (committed as docs/deployer-policy.json).

Sources, per service (the aws provider is the bridged terraform-provider-aws; the actions are
the SDK calls of each resource's Create/Read/Update/Delete there, plus the tagging calls):
- ec2: internal/service/ec2 (vpc_.go, vpc_subnet.go, vpc_internet_gateway.go, ec2_eip.go,
  vpc_nat_gateway.go, vpc_route_table.go, vpc_route_table_association.go, vpc_endpoint.go,
  ec2_launch_template.go, ec2_placement_group.go, vpc_security_group.go,
  vpc_security_group_rule.go; tags.go: CreateTags/DeleteTags).
- eks: internal/service/eks (cluster.go, addon.go, node_group.go, access_entry.go,
  access_policy_association.go, pod_identity_association.go, *_data_source.go); EKS creates its
  service-linked roles on first use (docs.aws.amazon.com/eks/latest/userguide/using-service-linked-roles-eks.html).
- iam: internal/service/iam (role.go: delete detaches and deletes inline policies first,
  role_policy.go, role_policy_attachment.go, role_data_source.go, user_data_source.go,
  session_context_data_source.go: GetRole for an assumed-role ARN).
- s3: internal/service/s3 (bucket.go reads every bucket sub-configuration,
  bucket_public_access_block.go, bucket_server_side_encryption_configuration.go).
- ecr: internal/service/ecr (pull_through_cache_rule.go, repository_creation_template.go).
- servicequotas: internal/service/servicequotas/service_quota_data_source.go
  (GetAWSDefaultServiceQuota then GetServiceQuota).
- sts: GetCallerIdentity needs no permission (docs.aws.amazon.com/STS/latest/APIReference/API_GetCallerIdentity.html).
pulumi-eks 4.x's eks:index:Cluster is a remote component whose AWS children are not visible to
the program (nodejs/eks/cluster/cluster.ts createCore, authenticationMode.ts, servicerole.ts,
nodes/securitygroup.ts, addons/cni-addon.ts): COMPONENT_CHILDREN lists those it creates with
this program's arguments (skipDefaultNodeGroup, API authentication, CoreDNS off, no OIDC
provider) so their actions are granted too."""

from __future__ import annotations

import json
from dataclasses import dataclass

_EC2_TAGS = ("ec2:CreateTags", "ec2:DeleteTags")
_EKS_TAGS = ("eks:TagResource", "eks:UntagResource")

RESOURCE_ACTIONS: dict[str, tuple[str, ...]] = {
    "aws:ec2/vpc:Vpc": ("ec2:CreateVpc", "ec2:DeleteVpc", "ec2:DescribeVpcs",
                        "ec2:DescribeVpcAttribute", "ec2:ModifyVpcAttribute",
                        "ec2:DescribeRouteTables", "ec2:DescribeNetworkAcls",
                        "ec2:DescribeSecurityGroups", *_EC2_TAGS),
    "aws:ec2/subnet:Subnet": ("ec2:CreateSubnet", "ec2:DeleteSubnet", "ec2:DescribeSubnets",
                              "ec2:ModifySubnetAttribute", "ec2:DescribeNetworkInterfaces",
                              *_EC2_TAGS),
    "aws:ec2/internetGateway:InternetGateway": (
        "ec2:CreateInternetGateway", "ec2:DeleteInternetGateway", "ec2:AttachInternetGateway",
        "ec2:DetachInternetGateway", "ec2:DescribeInternetGateways", *_EC2_TAGS),
    "aws:ec2/eip:Eip": ("ec2:AllocateAddress", "ec2:ReleaseAddress", "ec2:DescribeAddresses",
                        "ec2:DescribeAddressesAttribute", "ec2:DisassociateAddress", *_EC2_TAGS),
    "aws:ec2/natGateway:NatGateway": ("ec2:CreateNatGateway", "ec2:DeleteNatGateway",
                                      "ec2:DescribeNatGateways", *_EC2_TAGS),
    "aws:ec2/routeTable:RouteTable": ("ec2:CreateRouteTable", "ec2:DeleteRouteTable",
                                      "ec2:DescribeRouteTables", "ec2:CreateRoute",
                                      "ec2:DeleteRoute", "ec2:ReplaceRoute", *_EC2_TAGS),
    "aws:ec2/routeTableAssociation:RouteTableAssociation": (
        "ec2:AssociateRouteTable", "ec2:DisassociateRouteTable",
        "ec2:ReplaceRouteTableAssociation", "ec2:DescribeRouteTables"),
    "aws:ec2/vpcEndpoint:VpcEndpoint": (
        "ec2:CreateVpcEndpoint", "ec2:DeleteVpcEndpoints", "ec2:DescribeVpcEndpoints",
        "ec2:ModifyVpcEndpoint", "ec2:DescribePrefixLists", "ec2:DescribeVpcEndpointServices",
        *_EC2_TAGS),
    "aws:ec2/launchTemplate:LaunchTemplate": (
        "ec2:CreateLaunchTemplate", "ec2:CreateLaunchTemplateVersion", "ec2:ModifyLaunchTemplate",
        "ec2:DeleteLaunchTemplate", "ec2:DescribeLaunchTemplates",
        "ec2:DescribeLaunchTemplateVersions", *_EC2_TAGS),
    "aws:ec2/placementGroup:PlacementGroup": ("ec2:CreatePlacementGroup",
                                              "ec2:DeletePlacementGroup",
                                              "ec2:DescribePlacementGroups", *_EC2_TAGS),
    "aws:ec2/securityGroup:SecurityGroup": (
        "ec2:CreateSecurityGroup", "ec2:DeleteSecurityGroup", "ec2:DescribeSecurityGroups",
        "ec2:AuthorizeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupEgress",
        "ec2:RevokeSecurityGroupIngress", "ec2:RevokeSecurityGroupEgress",
        "ec2:DescribeNetworkInterfaces", *_EC2_TAGS),
    "aws:ec2/securityGroupRule:SecurityGroupRule": (
        "ec2:AuthorizeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupEgress",
        "ec2:RevokeSecurityGroupIngress", "ec2:RevokeSecurityGroupEgress",
        "ec2:DescribeSecurityGroups", "ec2:DescribeSecurityGroupRules",
        "ec2:UpdateSecurityGroupRuleDescriptionsIngress",
        "ec2:UpdateSecurityGroupRuleDescriptionsEgress"),
    "aws:ecr/pullThroughCacheRule:PullThroughCacheRule": (
        "ecr:CreatePullThroughCacheRule", "ecr:DeletePullThroughCacheRule",
        "ecr:DescribePullThroughCacheRules", "ecr:UpdatePullThroughCacheRule"),
    "aws:ecr/repositoryCreationTemplate:RepositoryCreationTemplate": (
        "ecr:CreateRepositoryCreationTemplate", "ecr:DeleteRepositoryCreationTemplate",
        "ecr:DescribeRepositoryCreationTemplates", "ecr:UpdateRepositoryCreationTemplate"),
    "aws:eks/cluster:Cluster": (
        "eks:CreateCluster", "eks:DeleteCluster", "eks:DescribeCluster",
        "eks:UpdateClusterConfig", "eks:UpdateClusterVersion", "eks:DescribeUpdate",
        "iam:PassRole", "iam:CreateServiceLinkedRole", "ec2:DescribeSubnets",
        "ec2:DescribeSecurityGroups", "ec2:DescribeVpcs", *_EKS_TAGS),
    "aws:eks/addon:Addon": ("eks:CreateAddon", "eks:DeleteAddon", "eks:DescribeAddon",
                            "eks:UpdateAddon", "eks:DescribeAddonVersions", "eks:DescribeUpdate",
                            *_EKS_TAGS),
    "aws:eks/nodeGroup:NodeGroup": (
        "eks:CreateNodegroup", "eks:DeleteNodegroup", "eks:DescribeNodegroup",
        "eks:UpdateNodegroupConfig", "eks:UpdateNodegroupVersion", "eks:DescribeUpdate",
        "iam:PassRole", "iam:CreateServiceLinkedRole", "iam:GetRole",
        "ec2:DescribeLaunchTemplateVersions", "ec2:DescribeSubnets", *_EKS_TAGS),
    "aws:eks/accessEntry:AccessEntry": ("eks:CreateAccessEntry", "eks:DeleteAccessEntry",
                                        "eks:DescribeAccessEntry", "eks:UpdateAccessEntry",
                                        *_EKS_TAGS),
    "aws:eks/accessPolicyAssociation:AccessPolicyAssociation": (
        "eks:AssociateAccessPolicy", "eks:DisassociateAccessPolicy",
        "eks:ListAssociatedAccessPolicies"),
    "aws:eks/podIdentityAssociation:PodIdentityAssociation": (
        "eks:CreatePodIdentityAssociation", "eks:DeletePodIdentityAssociation",
        "eks:DescribePodIdentityAssociation", "eks:UpdatePodIdentityAssociation",
        "iam:PassRole", "iam:GetRole", *_EKS_TAGS),
    "aws:iam/role:Role": (
        "iam:CreateRole", "iam:DeleteRole", "iam:GetRole", "iam:UpdateRole",
        "iam:UpdateAssumeRolePolicy", "iam:TagRole", "iam:UntagRole", "iam:ListRolePolicies",
        "iam:ListAttachedRolePolicies", "iam:ListInstanceProfilesForRole",
        "iam:DeleteRolePolicy", "iam:DetachRolePolicy"),
    "aws:iam/rolePolicy:RolePolicy": ("iam:PutRolePolicy", "iam:GetRolePolicy",
                                      "iam:DeleteRolePolicy"),
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment": (
        "iam:AttachRolePolicy", "iam:DetachRolePolicy", "iam:ListAttachedRolePolicies"),
    "aws:s3/bucket:Bucket": (
        "s3:CreateBucket", "s3:DeleteBucket", "s3:ListBucket", "s3:GetBucketLocation",
        "s3:GetBucketAcl", "s3:GetBucketCORS", "s3:GetBucketWebsite", "s3:GetBucketVersioning",
        "s3:GetAccelerateConfiguration", "s3:GetBucketRequestPayment", "s3:GetBucketLogging",
        "s3:GetLifecycleConfiguration", "s3:GetReplicationConfiguration",
        "s3:GetEncryptionConfiguration", "s3:GetBucketObjectLockConfiguration",
        "s3:GetBucketPolicy", "s3:GetBucketTagging", "s3:PutBucketTagging"),
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock": (
        "s3:PutBucketPublicAccessBlock", "s3:GetBucketPublicAccessBlock"),
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration": (
        "s3:PutEncryptionConfiguration", "s3:GetEncryptionConfiguration"),
}

# What an input of a resource makes the provider call beyond the type's own actions, keyed on
# (type, input name): granted whenever a stack may set it. force_destroy on a bucket: `pulumi
# destroy` of a non-empty bucket empties it first (internal/service/s3/bucket.go
# resourceBucketDelete calls emptyBucket on BucketNotEmpty; delete.go): ListObjectVersions pages
# (IAM action s3:ListBucketVersions), DeleteObjects of every version and delete marker with
# their VersionId (s3:DeleteObjectVersion), DeleteObject for keys outside XML's character range
# (s3:DeleteObject), both with BypassGovernanceRetention set when forced
# (s3:BypassGovernanceRetention). Legal holds (PutObjectLegalHold) are tried only after an
# AccessDenied on an Object Lock bucket, which the stack's bucket is not.
SETTING_ACTIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("aws:s3/bucket:Bucket", "forceDestroy"): (
        "s3:ListBucketVersions", "s3:DeleteObjectVersion", "s3:DeleteObject",
        "s3:BypassGovernanceRetention"),
}


def setting_actions(resource_type: str, inputs: dict) -> set[str]:
    """The actions `inputs` (as the program declares them) add to the type's own."""
    return {a for (t, key), acts in SETTING_ACTIONS.items()
            if t == resource_type and inputs.get(key) for a in acts}


INVOKE_ACTIONS: dict[str, tuple[str, ...]] = {
    "aws:index/getAvailabilityZones:getAvailabilityZones": ("ec2:DescribeAvailabilityZones",),
    "aws:index/getCallerIdentity:getCallerIdentity": (),  # sts: no permission needed
    "aws:index/getPartition:getPartition": (),  # computed from the provider's Region
    "aws:index/getRegion:getRegion": (),  # likewise
    "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": (
        "ec2:DescribeInstanceTypeOfferings",),
    "aws:ec2/getVpcs:getVpcs": ("ec2:DescribeVpcs",),
    "aws:ec2/getSubnet:getSubnet": ("ec2:DescribeSubnets",),
    "aws:ec2/getSubnets:getSubnets": ("ec2:DescribeSubnets",),
    "aws:eks/getCluster:getCluster": ("eks:DescribeCluster",),
    # A token presigned locally (an STS GetCallerIdentity URL): no call, no permission; what the
    # token may read in the cluster is its access entry's (infra/existing_kueue.py).
    "aws:eks/getClusterAuth:getClusterAuth": (),
    "aws:eks/getNodeGroup:getNodeGroup": ("eks:DescribeNodegroup",),
    "aws:eks/getNodeGroups:getNodeGroups": ("eks:ListNodegroups",),
    "aws:eks/getAddon:getAddon": ("eks:DescribeAddon",),
    "aws:eks/getAddonVersion:getAddonVersion": ("eks:DescribeAddonVersions",),
    "aws:eks/getAccessEntry:getAccessEntry": ("eks:DescribeAccessEntry",),
    "aws:iam/getRole:getRole": ("iam:GetRole",),
    "aws:iam/getUser:getUser": ("iam:GetUser",),
    "aws:iam/getSessionContext:getSessionContext": ("iam:GetRole",),
    "aws:servicequotas/getServiceQuota:getServiceQuota": (
        "servicequotas:GetServiceQuota", "servicequotas:GetAWSDefaultServiceQuota"),
}

# Remote components: the AWS resource types and invokes their (unseen) children use.
COMPONENT_CHILDREN: dict[str, tuple[str, ...]] = {
    "eks:index:Cluster": (
        "aws:eks/cluster:Cluster", "aws:iam/role:Role",
        "aws:iam/rolePolicyAttachment:RolePolicyAttachment", "aws:ec2/securityGroup:SecurityGroup",
        "aws:ec2/securityGroupRule:SecurityGroupRule", "aws:eks/addon:Addon",
        "aws:eks/accessEntry:AccessEntry",
        "aws:eks/accessPolicyAssociation:AccessPolicyAssociation",
        "aws:index/getPartition:getPartition", "aws:index/getRegion:getRegion",
        "aws:eks/getAddonVersion:getAddonVersion"),  # the VPC CNI's version (cni-addon.ts)
}

# Types that are not AWS API calls: the engine's own, Kubernetes objects (RBAC of the cluster,
# granted by the deployer's EKS access entry), and this project's components.
NO_IAM_PREFIXES = ("pulumi:", "kubernetes:", "eksraytrain:")


@dataclass(frozen=True)
class Uncovered:
    """Tokens the program used that the table does not cover."""
    resources: tuple[str, ...]
    invokes: tuple[str, ...]


def uncovered(resource_types: set[str], invoke_tokens: set[str]) -> Uncovered:
    """The used resource types / invoke tokens the table does not cover: an AWS type without
    actions, or a type of another package that is neither IAM-free nor a listed component."""
    children = {c for t in resource_types for c in COMPONENT_CHILDREN.get(t, ())}
    types = (resource_types | children) - set(INVOKE_ACTIONS) - set(COMPONENT_CHILDREN)
    missing = {t for t in types if not t.startswith(NO_IAM_PREFIXES)} - set(RESOURCE_ACTIONS)
    invokes = invoke_tokens | (children & set(INVOKE_ACTIONS))
    return Uncovered(tuple(sorted(missing)), tuple(sorted(invokes - set(INVOKE_ACTIONS))))


def policy() -> dict:
    """The policy document: one statement per service, actions sorted, on every resource (names
    are the stack's own and auto-named, so actions, not ARNs, are what this narrows)."""
    actions = {a for table in (RESOURCE_ACTIONS, INVOKE_ACTIONS, SETTING_ACTIONS)
               for acts in table.values() for a in acts}
    services = sorted({a.split(":")[0] for a in actions})
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": f"PulumiDeployer{service.capitalize()}", "Effect": "Allow",
         "Action": sorted(a for a in actions if a.startswith(f"{service}:")), "Resource": "*"}
        for service in services]}


def render() -> str:
    return json.dumps(policy(), indent=2) + "\n"


if __name__ == "__main__":
    print(render(), end="")
