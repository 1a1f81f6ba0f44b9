"""The `training/` package as ConfigMap data: no image build, and a content hash for job names.

Each run carries its own: a ConfigMap named for its RayJob and the bundle's digest, owned by the
RayJob (so it goes with it), holding exactly the keys its volume's items name. A run submitted
from a checkout therefore runs that checkout's code, never the code a `pulumi up` deployed
(whose file list may differ: a key an item names but the ConfigMap lacks keeps the pod in
ContainerCreating, kubelet's configMap volume plugin refusing a missing non-optional key).

The ConfigMap limit is the API server's: ValidateConfigMap sums len(value) of data and
binaryData (keys not counted) and refuses a total over core.MaxSecretSize, 1 * 1024 * 1024
bytes (kubernetes pkg/apis/core/validation/validation.go, pkg/apis/core/types.go)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from stack.kube import CODE_DIGEST_ANNOTATION, code_configmap_name
from training.errors import InputError
from workloads.owners import owned_by

CONFIGMAP_LIMIT_BYTES = 1024 * 1024  # core.MaxSecretSize: the API server refuses more
INCLUDE_SUFFIXES = (".py", ".jsonl", ".txt", ".json", ".yaml")  # .yaml: lm-eval task files
PACKAGE = "training"


class CodeBundleError(InputError):
    """The training code cannot ship in a ConfigMap."""


@dataclass(frozen=True)
class CodeBundle:
    data: dict[str, str]  # ConfigMap key -> file text
    items: list[dict]  # volume items: ConfigMap key -> relative path under the mount
    digest: str  # sha256 of every path and its bytes

    @property
    def size(self) -> int:
        """Bytes as the API server counts them (UTF-8 values, no keys)."""
        return sum(len(v.encode()) for v in self.data.values())

    def volume(self, rayjob_name: str) -> dict:
        """The pods' `code` volume: the run's own ConfigMap, its files at their paths."""
        return {"name": "code", "configMap": {
            "name": code_configmap_name(rayjob_name, self.digest), "items": self.items}}


def configmap(code: CodeBundle, job: dict) -> dict:
    """The run's code ConfigMap for `job` as the API server returned it (with its uid)."""
    meta = job["metadata"]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": code_configmap_name(meta["name"], code.digest),
                         "namespace": meta["namespace"],
                         "annotations": {CODE_DIGEST_ANNOTATION: code.digest},
                         "ownerReferences": owned_by(job)},
            "data": dict(code.data)}


def _key(relative: str) -> str:
    """ConfigMap keys allow [-._a-zA-Z0-9] only: `training/a/x.py` -> `training..a..x.py`."""
    return relative.replace("/", "..")


def bundle(root: Path, limit: int = CONFIGMAP_LIMIT_BYTES) -> CodeBundle:
    """Every source file of `root/training` (no caches), checked against the ConfigMap limit."""
    package = root / PACKAGE
    files = sorted(p for p in package.rglob("*") if p.is_file() and p.suffix in INCLUDE_SUFFIXES
                   and "__pycache__" not in p.parts)
    data, items, h = {}, [], hashlib.sha256()
    for path in files:
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        data[_key(rel)] = text
        items.append({"key": _key(rel), "path": rel})
        h.update(rel.encode() + b"\0" + text.encode() + b"\0")
    result = CodeBundle(data, items, h.hexdigest())
    if result.size > limit:
        biggest = max(files, key=lambda p: p.stat().st_size)
        raise CodeBundleError(f"training/ is {result.size:,} bytes, over the {limit:,}-byte "
                              f"ConfigMap limit of the Kubernetes API (largest file: {biggest.relative_to(root)}); move "
                              "data files to S3 and pass them with training.data")
    return result
