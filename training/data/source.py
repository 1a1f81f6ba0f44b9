"""A `--data` source: its files in a fixed order, what identifies their contents, and their rows.

Files are read where the driver runs, before Ray starts, so a bad row is reported with its file
and row number before anything is spent. A directory is every `.jsonl`, `.json` and `.parquet`
file under it, sorted by path. The identity of a local file is its content's sha256 (a copy of
the same data is the same data); of an S3 object, its key, size and last-modified time, which
every PUT renews (pyarrow's listing carries no ETag). A Hugging Face Hub split (`hf://`, hub.py)
is its files in the local hub cache, identified by the commit they were fetched at.

JSON Lines are split on "\n" only (a "\r" before it is JSON whitespace): `str.splitlines()`
also splits at U+2028, U+2029, U+0085 and other separators, which `json.dumps(...,
ensure_ascii=False)` writes raw inside strings. A `.json` file is a JSON array of row objects or
JSON Lines, as the `datasets` library's Json builder reads either (packaged_modules/json/json.py);
a row of an array is numbered by its place in it, from 1.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Iterator

import pyarrow.fs as pafs
from pyarrow.lib import ArrowException

from training.data import DataError, hub
from training.storage import StorageError, resolve

SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Source:
    uri: str
    fs: pafs.FileSystem
    root: str  # path of `uri` on `fs`
    files: tuple[pafs.FileInfo, ...]
    hub_commit: tuple[str, str] | None = None  # (repo, commit) of a Hugging Face Hub split

    @classmethod
    def open(cls, uri: str, flag: str = "--data") -> "Source":
        if hub.is_hub(uri):
            return cls._from_hub(uri, flag)
        try:
            storage = resolve(uri, flag)
            info = storage.filesystem.get_file_info(storage.path)
            if info.type == pafs.FileType.Directory:
                listing = storage.filesystem.get_file_info(
                    pafs.FileSelector(storage.path, recursive=True))
                files = sorted((f for f in listing if f.type == pafs.FileType.File
                                and f.path.endswith(SUFFIXES)), key=lambda f: f.path)
            else:
                files = [info] if info.type == pafs.FileType.File else []
        except (StorageError, OSError, ArrowException) as e:
            raise DataError(f"{flag} {uri!r}: cannot list it ({str(e).splitlines()[0]})") from None
        if not files:
            raise DataError(f"{flag} {uri!r}: no such file, or no {'/'.join(SUFFIXES)} files in it")
        return cls(uri, storage.filesystem, storage.path, tuple(files))

    @classmethod
    def _from_hub(cls, uri: str, flag: str) -> "Source":
        snap = hub.fetch(uri, flag, SUFFIXES)
        fs = pafs.LocalFileSystem()
        files = fs.get_file_info([f"{snap.folder}/{name}" for name in snap.files])
        return cls(uri, fs, snap.folder, tuple(files), (snap.repo, snap.commit))

    def _name(self, info: pafs.FileInfo) -> str:
        return info.path[len(self.root):].lstrip("/")

    def display(self, info: pafs.FileInfo) -> str:
        if self.hub_commit:
            repo, commit = self.hub_commit
            return f"hf://{repo}@{commit[:12]}/{self._name(info)}"
        local = isinstance(self.fs, pafs.LocalFileSystem)
        return info.path if local else f"s3://{info.path}"

    def identity(self) -> list:
        """(name under the source, size, content identity) of every file."""
        out = []
        for f in self.files:
            name = self._name(f)
            if self.hub_commit:  # a commit is content-addressed: nothing to hash
                out.append((name, f.size, "@".join(self.hub_commit)))
            elif isinstance(self.fs, pafs.LocalFileSystem):
                with self.fs.open_input_stream(f.path) as stream:
                    digest = hashlib.file_digest(stream, "sha256").hexdigest()
                out.append((name, f.size, digest))
            else:
                out.append((name, f.size, f.mtime_ns))
        return out

    def rows(self) -> Iterator[tuple[str, int, dict]]:
        """(file, row number from 1, row) of every row, in order."""
        for f in self.files:
            where = self.display(f)
            reader = _parquet_rows if f.path.endswith(".parquet") else _json_rows
            try:
                for number, row in reader(self.fs, f.path, where):
                    yield where, number, row
            except (OSError, ArrowException) as e:
                raise DataError(f"{where}: cannot read it ({str(e).splitlines()[0]})") from None


def _json_rows(fs: pafs.FileSystem, path: str, where: str) -> Iterator[tuple[int, dict]]:
    """Rows of a JSON Lines file, or of a `.json` file holding one array of objects."""
    with fs.open_input_stream(path) as stream:
        text = stream.read().decode()
    if path.endswith(".json") and text.lstrip().startswith("["):
        yield from _array_rows(text, where)
        return
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{where} row {number}: not JSON ({e.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where} row {number}: a JSON object per line, got "
                            f"{type(row).__name__}")
        yield number, row


def _array_rows(text: str, where: str) -> Iterator[tuple[int, dict]]:
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{where}: not a JSON array ({e.msg}, line {e.lineno})") from None
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise DataError(f"{where} row {number}: a JSON array of objects, got "
                            f"{type(row).__name__}")
        yield number, row


def _parquet_rows(fs: pafs.FileSystem, path: str, where: str) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    number = 0
    with fs.open_input_file(path) as f:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                number += 1
                yield number, row
