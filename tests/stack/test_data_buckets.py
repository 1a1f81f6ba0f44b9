"""dataBuckets: where the job may read besides its checkpoint bucket, and runs that would read
elsewhere refused before any resource."""

from __future__ import annotations

import json

import pytest

from stack.config import ConfigError
from stack.parse import parse
from tests.stack.stacks import STACK_FILES, raw_config

DEV = next(p for p in STACK_FILES if p.name == "Pulumi.dev.yaml")


def problems(**raw: object) -> list[str]:
    base, region = raw_config(DEV)
    try:
        parse({**base, **{k: v if isinstance(v, str) else json.dumps(v) for k, v in raw.items()}},
              region)
    except ConfigError as e:
        return e.problems
    return []


@pytest.mark.parametrize("entry, fix", [
    ("my-bucket/chats/", "not an s3:// URI"),
    ("s3://My_Bucket/", "not an S3 bucket name"),
    ("s3://my-bucket/chats", "must end with '/' (s3://my-bucket/chats/)"),
    ("s3://my-bucket/chats/*", "no wildcards"),
])
def test_a_malformed_entry_is_refused_naming_the_key_and_the_fix(entry, fix):
    found = problems(dataBuckets=[entry])
    assert any(p.startswith("dataBuckets:") and fix in p for p in found), found


def test_data_buckets_must_be_a_list_of_strings():
    found = problems(dataBuckets=[["s3://my-bucket/"]])
    assert any(p.startswith("dataBuckets: expected a list of strings") for p in found), found


@pytest.mark.parametrize("key, flag", [("data", "training.data"),
                                       ("evalData", "training.evalData"),
                                       ("model", "training.model")])
def test_a_run_reading_s3_outside_the_data_buckets_is_refused(key, flag):
    training = {"data": "s3://my-bucket/chats/train.jsonl", key: "s3://other/x/y.jsonl"}
    found = problems(dataBuckets=["s3://my-bucket/chats/"], training=training)
    assert any(p.startswith(f"{flag}: s3://other/x/y.jsonl lies outside dataBuckets")
               and 'add its bucket or prefix to dataBuckets, e.g. ["s3://other/"]' in p
               for p in found), found


def test_the_readme_example_is_refused_without_data_buckets():
    found = problems(training={"data": "s3://my-bucket/chats/"})
    assert any(p.startswith("training.data: s3://my-bucket/chats/ lies outside") for p in found)


def test_a_sibling_prefix_is_not_inside():
    """`chats/` does not hold `chats-private/`: the check is on whole path segments."""
    found = problems(dataBuckets=["s3://my-bucket/chats/"],
                     training={"data": "s3://my-bucket/chats-private/a.jsonl"})
    assert any(p.startswith("training.data:") for p in found), found


@pytest.mark.parametrize("buckets, training", [
    (["s3://my-bucket/chats/"], {"data": "s3://my-bucket/chats/train.jsonl",
                                 "evalData": "s3://my-bucket/chats/test.jsonl"}),
    (["s3://my-bucket"], {"data": "s3://my-bucket/any/where.jsonl"}),
    # A previous run's export in the stack's own checkpoint bucket (Pulumi names it).
    ([], {"model": "s3://ckpt-checkpoints-1a2b3c4/runs/r1/hf_model/", "data": "random"}),
    ([], {"data": "hf://trl-lib/Capybara"}),
])
def test_reads_inside_the_data_buckets_or_the_checkpoint_bucket_pass(buckets, training):
    assert problems(dataBuckets=buckets, training=training) == []
