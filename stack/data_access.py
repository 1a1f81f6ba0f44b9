"""What the job may read besides its checkpoint bucket: the stack key `dataBuckets`, a list of
`s3://bucket` or `s3://bucket/prefix/`. Pulumi-free: the locations are parsed and checked here,
the pods' role is granted read-only access to them by infra/policies.py `data_read`.

A run whose S3 `data`, `evalData` or `model` (the stack's `training` object) lies outside these
locations and the checkpoint bucket would fail only once its GPU nodes are up (AccessDenied from
S3 in the driver or the workers), so stack validation refuses it before any resource.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The checkpoint bucket's name: Pulumi auto-names it from its logical name `ckpt-checkpoints`
# (program.py CheckpointStorage("ckpt"), infra/storage.py) plus a random suffix, so it is not
# known before the first up; a path in a bucket of that name is taken to be the stack's own.
CHECKPOINT_BUCKET_PREFIX = "ckpt-checkpoints-"
# S3 general purpose bucket names: 3-63 lowercase letters, digits, '.' and '-', starting and
# ending with a letter or digit (S3 user guide, bucketnamingrules).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_EXAMPLE = '["s3://my-bucket/chats/"]'


@dataclass(frozen=True)
class S3Location:
    """A bucket, and the key prefix within it ("" for the whole bucket; else ends with '/')."""

    bucket: str
    prefix: str

    def holds(self, bucket: str, key: str) -> bool:
        return bucket == self.bucket and key.startswith(self.prefix)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def split_s3(uri: str) -> tuple[str, str]:
    """`s3://bucket/key` -> (bucket, key)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def parse_location(uri: str) -> S3Location:
    """One `dataBuckets` entry; ValueError saying what is wrong with it. A prefix must end with
    '/': IAM's `prefix*` on `chats` would also grant `chats-private/`."""
    if not uri.startswith("s3://"):
        raise ValueError("not an s3:// URI")
    bucket, key = split_s3(uri)
    if not _BUCKET.match(bucket):
        raise ValueError(f"{bucket!r} is not an S3 bucket name")
    if "*" in key or "?" in key:
        raise ValueError("no wildcards: name a bucket or a prefix")
    if key and not key.endswith("/"):
        raise ValueError(f"the prefix must end with '/' (s3://{bucket}/{key}/)")
    return S3Location(bucket, key)


def locations(entries: tuple[str, ...]) -> tuple[S3Location, ...]:
    """The parsed entries (validation has refused malformed ones first)."""
    return tuple(parse_location(e) for e in entries)


def data_access_problems(entries: tuple[str, ...], reads: dict[str, str | None]) -> list[str]:
    """Malformed `dataBuckets` entries, and each S3 path of `reads` (the training key -> its
    value) that lies outside them and the checkpoint bucket."""
    p: list[str] = []
    allowed: list[S3Location] = []
    for entry in entries:
        try:
            allowed.append(parse_location(entry))
        except ValueError as e:
            p.append(f"dataBuckets: {entry!r}: {e}; expected s3://bucket or s3://bucket/prefix/, "
                     f"e.g. {_EXAMPLE}")
    for key, uri in reads.items():
        if not (uri and uri.startswith("s3://")):
            continue
        bucket, path = split_s3(uri)
        if bucket.startswith(CHECKPOINT_BUCKET_PREFIX) or any(a.holds(bucket, path) for a in allowed):
            continue
        p.append(f"{key}: {uri} lies outside dataBuckets and the checkpoint bucket, so the job "
                 f"may not read it; add its bucket or prefix to dataBuckets, e.g. "
                 f"[\"s3://{bucket}/\"]")
    return p
