"""Resolve and probe the run's storage before any training starts.

`s3://` paths use the AWS default credential chain (EKS Pod Identity on the cluster). An
S3-compatible endpoint (MinIO, a test server) is taken from AWS_ENDPOINT_URL_S3 or
AWS_ENDPOINT_URL, which the AWS CLI and SDKs honour too.
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlparse

import pyarrow.fs as pafs
from pyarrow.lib import ArrowException
from training.errors import InputError


class StorageError(InputError):
    """The storage path cannot hold checkpoints."""


@dataclass(frozen=True)
class Storage:
    uri: str  # what the user gave, for messages and the summary
    path: str  # path on `filesystem`
    filesystem: pafs.FileSystem

    def run_dir(self, name: str) -> str:
        """Where Ray Train keeps the run `name` (RunConfig(name, storage_path)) on `filesystem`."""
        return f"{self.path}/{name}"

    def display(self, fs_path: str) -> str:
        return display_path(self.filesystem, fs_path)


def display_path(fs: pafs.FileSystem, fs_path: str) -> str:
    """A path on `fs` as a user writes it: s3://bucket/key on S3, the local path otherwise."""
    return f"s3://{fs_path}" if isinstance(fs, pafs.S3FileSystem) else fs_path


# What `resolve` reads from the environment for S3; set on the driver (a local run against an
# S3-compatible server), the same values reach the train workers (cli._fit). On EKS none is set:
# every pod has its own Pod Identity credentials.
S3_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
          "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION")


def s3_env() -> dict[str, str]:
    return {k: os.environ[k] for k in S3_ENV if os.environ.get(k)}


def resolve(uri: str, flag: str = "--storage-path") -> Storage:
    """`uri` (a local path or s3://) on its filesystem; `flag` names it in errors."""
    if uri.startswith("s3://"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if not endpoint:  # AWS itself: pyarrow finds the bucket's Region
            try:
                fs, path = pafs.FileSystem.from_uri(uri)
            except (OSError, ArrowException) as e:
                raise StorageError(f"{flag} {uri!r}: {str(e).splitlines()[0]}") from None
            return Storage(uri, path.rstrip("/"), fs)
        parsed, ep = urlparse(uri), urlparse(endpoint)
        kwargs = {"endpoint_override": ep.netloc, "scheme": ep.scheme or "https"}
        if os.environ.get("AWS_ACCESS_KEY_ID"):  # static keys travel with the pickled fs
            kwargs["access_key"] = os.environ["AWS_ACCESS_KEY_ID"]
            kwargs["secret_key"] = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        return Storage(uri, f"{parsed.netloc}{parsed.path}".rstrip("/"), pafs.S3FileSystem(**kwargs))
    if "://" in uri:
        raise StorageError(f"{flag} {uri!r}: only local paths and s3:// are supported")
    return Storage(uri, os.path.abspath(os.path.expanduser(uri)), pafs.LocalFileSystem())


def check_writable(storage: Storage) -> None:
    """Write and delete a probe file, so an unusable path fails now, not at the first checkpoint."""
    probe = f"{storage.path}/.write-probe-{uuid.uuid4().hex}"
    try:
        storage.filesystem.create_dir(storage.path, recursive=True)
        with storage.filesystem.open_output_stream(probe) as f:
            f.write(b"ok")
        storage.filesystem.delete_file(probe)
    except (OSError, ArrowException) as e:
        raise StorageError(f"--storage-path {storage.uri!r} is not writable: "
                           f"{str(e).splitlines()[0]}") from None


@contextmanager
def removed_on_refusal(storage: Storage, name: str) -> Iterator[None]:
    """Bad input found before a run's first step (an InputError) removes what the attempt
    created: the run directory `name` when it did not exist before, and on a local path the
    directories above it made for it (the storage path itself, when it was new). A run directory
    that existed (a rerun) is left as it was found but for a tokenized cache the attempt may have
    completed, which the next attempt with the same data and settings reuses."""
    new = _first_missing(storage, storage.run_dir(name))
    try:
        yield
    except InputError:
        if new is not None:
            try:
                storage.filesystem.delete_dir(new)
            except (OSError, ArrowException):  # never created after all
                pass
        raise


def _first_missing(storage: Storage, run_dir: str) -> str | None:
    """The topmost directory of `run_dir`'s path that does not exist yet (S3: the run's prefix
    when nothing is under it), or None."""
    if not isinstance(storage.filesystem, pafs.LocalFileSystem):
        try:
            absent = storage.filesystem.get_file_info(run_dir).type == pafs.FileType.NotFound
        except (OSError, ArrowException):
            return None
        return run_dir if absent else None
    missing, path = None, run_dir
    while not os.path.lexists(path):
        missing, path = path, os.path.dirname(path)
    return missing
