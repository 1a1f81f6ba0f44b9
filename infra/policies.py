"""IAM policy documents as plain dicts (exact JSON is what the tests check)."""

from __future__ import annotations

from stack.data_access import S3Location

# Managed policies worker nodes need and nothing more: join the cluster, pull images, run the VPC
# CNI. Pods get AWS access through Pod Identity, never through the node role. ARNs of the aws
# partition: the program refuses Regions of any other (infra/lookups.py require_aws_partition).
NODE_POLICY_ARNS = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
)
CLUSTER_ADMIN_POLICY_ARN = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy"


def assume_role(service: str, actions: tuple[str, ...] = ("sts:AssumeRole",)) -> dict:
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": list(actions)}]}


def pod_identity_trust() -> dict:
    """EKS Pod Identity assumes the role and tags the session with the pod's identity."""
    return assume_role("pods.eks.amazonaws.com", ("sts:AssumeRole", "sts:TagSession"))


def bucket_access(bucket_arn: str) -> dict:
    """Read, write and list one bucket: the checkpoint bucket, nothing else."""
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
         "Resource": bucket_arn},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                                       "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
         "Resource": f"{bucket_arn}/*"},
    ]}


def cluster_autoscaler(cluster_name: str) -> dict:
    """The "Full Cluster Autoscaler Features Policy" of kubernetes/autoscaler
    cloudprovider/aws/README.md (auto-discovery, instance types from EC2, eks:DescribeNodegroup for
    the labels, taints and resource tags of a managed node group at zero nodes), with its scaling
    actions restricted by tag as that README recommends: EKS tags a managed node group's Auto
    Scaling group for the Cluster Autoscaler (EKS user guide, managed-node-groups), with
    k8s.io/cluster-autoscaler/<cluster>: owned, the condition of the EKS user guide's
    cluster-autoscaler policy. The autoscaler can then resize only this cluster's groups."""
    return {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": [
            "autoscaling:DescribeAutoScalingGroups", "autoscaling:DescribeAutoScalingInstances",
            "autoscaling:DescribeLaunchConfigurations", "autoscaling:DescribeScalingActivities",
            "ec2:DescribeImages", "ec2:DescribeInstanceTypes",
            "ec2:DescribeLaunchTemplateVersions", "ec2:GetInstanceTypesFromInstanceRequirements",
            "eks:DescribeNodegroup"], "Resource": ["*"]},
        {"Effect": "Allow", "Action": [
            "autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
         "Resource": ["*"], "Condition": {"StringEquals": {
             f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}}},
    ]}


def data_read(locations: tuple[S3Location, ...]) -> dict | None:
    """Read-only access to the stack's dataBuckets (None when it lists none): s3:GetObject on the
    objects under each prefix, s3:ListBucket on its bucket only for keys under that prefix (the
    `s3:prefix` condition key of ListObjects; IAM user guide, reference_policies_examples_s3_
    home-directory-console, and the S3 service authorization reference), nothing written."""
    if not locations:
        return None
    statements: list[dict] = []
    for loc in locations:
        bucket_arn = f"arn:aws:s3:::{loc.bucket}"
        listing: dict = {"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
                         "Resource": bucket_arn}
        if loc.prefix:
            listing = {**listing, "Action": ["s3:ListBucket"], "Condition": {
                "StringLike": {"s3:prefix": [loc.prefix, f"{loc.prefix}*"]}}}
        statements += [listing, {"Effect": "Allow", "Action": ["s3:GetObject"],
                                 "Resource": f"{bucket_arn}/{loc.prefix}*"}]
    return {"Version": "2012-10-17", "Statement": statements}
