"""The `training/` package as ConfigMap data: no image build, and a content hash for job names."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from training.errors import InputError

CONFIGMAP_LIMIT_BYTES = 1024 * 1024  # Kubernetes rejects larger ConfigMaps
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
        return sum(len(v.encode()) for v in self.data.values())


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
                              f"ConfigMap limit (largest file: {biggest.relative_to(root)}); move "
                              "data files to S3 and pass them with training.data")
    return result
