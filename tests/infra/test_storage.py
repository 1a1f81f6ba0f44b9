"""The checkpoint bucket under mocks: private, encrypted, kept on destroy unless told otherwise,
and reachable only by the Ray pods' role."""

from __future__ import annotations

import json

import pytest

from tests.infra.harness import run_program
from tests.infra.test_program import DEV


@pytest.mark.parametrize("force, retained", [("false", True), ("true", False)])
def test_destroy_keeps_the_bucket_unless_told_to_empty_it(force, retained):
    """No committed stack file sets forceDestroyBucket (tests/stack checks the files)."""
    m = run_program(DEV, {"forceDestroyBucket": force})
    assert m.one("aws:s3/bucket:Bucket").inputs["forceDestroy"] is (force == "true")
    for kept in ("ckpt-checkpoints", "ckpt-checkpoints-sse", "ckpt-checkpoints-private"):
        assert m.options[kept]["retainOnDelete"] is retained, kept  # kept encrypted and private


def test_bucket_is_private_encrypted_and_pods_reach_only_it(dev):
    # What runs produced outlives `pulumi destroy` on every committed stack, dev included.
    assert dev.one("aws:s3/bucket:Bucket").inputs["forceDestroy"] is False
    assert dev.options["ckpt-checkpoints"]["retainOnDelete"] is True
    pab = dev.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock").inputs
    assert all(pab[k] for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                "restrictPublicBuckets"))
    sse = dev.one("aws:s3/bucketServerSideEncryptionConfiguration:"
                  "BucketServerSideEncryptionConfiguration").inputs
    assert sse["rules"][0]["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    policy = json.loads(dev.one("aws:iam/rolePolicy:RolePolicy", "ckpt").inputs["policy"])
    resources = {r for s in policy["Statement"] for r in [s["Resource"]]}
    assert resources == {"arn:aws:s3:::ckpt-checkpoints-bucket",
                         "arn:aws:s3:::ckpt-checkpoints-bucket/*"}
    assert all("*" not in a for s in policy["Statement"] for a in s["Action"])
    trust = json.loads(next(r for r in dev.of_type("aws:iam/role:Role")
                            if r.name == "ckpt-ray-pods").inputs["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assoc = dev.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "ckpt").inputs
    assert (assoc["namespace"], assoc["serviceAccount"]) == ("ray", "ray-train")
    assert assoc["clusterName"] == "ray-train-dev"
