"""Checkpoint bucket and the Ray pods' access to it (EKS Pod Identity, that bucket only)."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from stack.config import StackConfig
from infra.policies import bucket_access, data_read, pod_identity_trust
from stack.data_access import locations


class CheckpointStorage(pulumi.ComponentResource):
    """Encrypted, private S3 bucket; a role only the Ray service account can assume."""

    bucket: aws.s3.Bucket
    role: aws.iam.Role  # the Ray pods' role: this bucket only
    association: aws.eks.PodIdentityAssociation  # the pods get credentials once it exists
    uri: pulumi.Output[str]  # s3://<bucket>/runs, the checkpointStorage output

    def __init__(self, name: str, cfg: StackConfig, cluster_name: pulumi.Input[str],
                 namespace: str, service_account: str,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("eksraytrain:infra:CheckpointStorage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # Without forceDestroyBucket, `pulumi destroy` keeps the bucket and its checkpoints (it
        # leaves the stack's state, not the account) instead of failing on a non-empty bucket,
        # and keeps it encrypted and private: its encryption and public-access settings are kept
        # with it (deleting them would leave a retained bucket without its public access block).
        kept = pulumi.ResourceOptions(parent=self, retain_on_delete=not cfg.force_destroy_bucket)
        self.bucket = aws.s3.Bucket(
            f"{name}-checkpoints", force_destroy=cfg.force_destroy_bucket, tags=dict(cfg.tags),
            opts=kept)
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-checkpoints-sse", bucket=self.bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": "aws:kms"},
                    "bucket_key_enabled": True}], opts=kept)
        aws.s3.BucketPublicAccessBlock(
            f"{name}-checkpoints-private", bucket=self.bucket.id, block_public_acls=True,
            block_public_policy=True, ignore_public_acls=True, restrict_public_buckets=True,
            opts=kept)
        self.role = aws.iam.Role(f"{name}-ray-pods", assume_role_policy=json.dumps(
            pod_identity_trust()), tags=dict(cfg.tags), opts=child)
        aws.iam.RolePolicy(f"{name}-ray-pods-bucket", role=self.role.id,
                           policy=self.bucket.arn.apply(lambda arn: json.dumps(bucket_access(arn))),
                           opts=child)
        data = data_read(locations(cfg.data_buckets))
        if data is not None:  # dataBuckets: read-only, scoped to each prefix
            aws.iam.RolePolicy(f"{name}-ray-pods-data", role=self.role.id,
                               policy=json.dumps(data), opts=child)
        self.association = aws.eks.PodIdentityAssociation(
            f"{name}-ray-pods-identity", cluster_name=cluster_name, namespace=namespace,
            service_account=service_account, role_arn=self.role.arn, tags=dict(cfg.tags),
            opts=child)
        self.uri = self.bucket.bucket.apply(lambda b: f"s3://{b}/runs")
        self.register_outputs({"uri": self.uri})
