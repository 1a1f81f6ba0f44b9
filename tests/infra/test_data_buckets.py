"""The pods' role reads the stack's dataBuckets, read-only and only under each prefix."""

from __future__ import annotations

import fnmatch
import json

from tests.infra.harness import run_program
from tests.infra.test_program import DEV


def _allows(policy: dict, action: str, resource: str, prefix: str | None = None) -> bool:
    """IAM's Allow evaluation for these statements: Action, Resource and StringLike s3:prefix,
    `*` matching any characters as IAM's wildcard does."""
    for s in policy["Statement"]:
        resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
        if action not in s["Action"] or not any(fnmatch.fnmatchcase(resource, r) for r in resources):
            continue
        like = s.get("Condition", {}).get("StringLike", {}).get("s3:prefix")
        if like is None or (prefix is not None and any(fnmatch.fnmatchcase(prefix, v) for v in like)):
            return True
    return False


def _data_policy(buckets: list[str]) -> dict:
    m = run_program(DEV, {"dataBuckets": json.dumps(buckets)})
    return json.loads(next(r for r in m.of_type("aws:iam/rolePolicy:RolePolicy")
                           if r.name == "ckpt-ray-pods-data").inputs["policy"])


def test_the_pods_read_a_prefix_and_nothing_beside_it():
    policy = _data_policy(["s3://my-bucket/chats/", "s3://whole"])
    assert _allows(policy, "s3:GetObject", "arn:aws:s3:::my-bucket/chats/train.jsonl")
    assert not _allows(policy, "s3:GetObject", "arn:aws:s3:::my-bucket/chats-private/x")
    assert not _allows(policy, "s3:GetObject", "arn:aws:s3:::my-bucket/other.jsonl")
    assert _allows(policy, "s3:ListBucket", "arn:aws:s3:::my-bucket", prefix="chats/")
    assert _allows(policy, "s3:ListBucket", "arn:aws:s3:::my-bucket", prefix="chats/2025/")
    assert not _allows(policy, "s3:ListBucket", "arn:aws:s3:::my-bucket", prefix="")
    assert not _allows(policy, "s3:ListBucket", "arn:aws:s3:::my-bucket", prefix="chats-private/")
    assert _allows(policy, "s3:GetObject", "arn:aws:s3:::whole/any/key")
    assert _allows(policy, "s3:ListBucket", "arn:aws:s3:::whole", prefix="")
    writes = {"s3:PutObject", "s3:DeleteObject", "s3:*"}
    assert not any(writes & set(s["Action"]) for s in policy["Statement"])


def test_no_data_buckets_no_second_policy(dev):
    assert not [r for r in dev.of_type("aws:iam/rolePolicy:RolePolicy")
                if r.name == "ckpt-ray-pods-data"]
