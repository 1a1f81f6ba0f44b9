"""The tokenized, packed form of a run's text in the run directory, named by a fingerprint of its
source."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow.fs as pafs

from training.data import DataError
from training.data.tokenize import tokenize

INDEX_FILE, TOKENS_FILE = "index.json", "tokens.u32"
DTYPE = np.dtype("<u4")


def text_format(uri: str) -> str:
    """`json` or `parquet`, from the path's suffix (a directory is read as jsonl)."""
    return "parquet" if uri.rstrip("/").lower().endswith(".parquet") else "json"


def fingerprint(uri: str, tokenizer_name: str, seq_len: int) -> str:
    """Names the tokenized form; local sources include each file's size and mtime."""
    files: list = []
    if "://" not in uri and os.path.exists(uri):
        paths = [uri] if os.path.isfile(uri) else sorted(
            os.path.join(d, f) for d, _, names in os.walk(uri) for f in names)
        files = [(p, os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in paths]
    key = json.dumps([uri, tokenizer_name, seq_len, files])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TokenCache:
    """The tokenized, packed samples of one run's text in `directory` on `fs`."""
    fs: pafs.FileSystem
    directory: str
    fingerprint: str

    @classmethod
    def for_run(cls, fs: pafs.FileSystem, run_dir: str, uri: str, tokenizer_name: str,
                seq_len: int) -> "TokenCache":
        fp = fingerprint(uri, tokenizer_name, seq_len)
        return cls(fs, f"{run_dir}/tokens-{fp}", fp)

    def index(self) -> dict | None:
        path = f"{self.directory}/{INDEX_FILE}"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with self.fs.open_input_stream(path) as f:
            return json.loads(f.read())

    def build(self, uri: str, tokenizer_name: str, seq_len: int) -> dict:
        """Tokenize `uri` with Ray Data (order preserved) and pack it here; reused when present."""
        if (existing := self.index()) is not None:
            return existing
        block = seq_len + 1
        self.fs.create_dir(self.directory, recursive=True)
        n_tokens = 0
        with self.fs.open_output_stream(f"{self.directory}/{TOKENS_FILE}") as out:
            for ids in _token_stream(uri, tokenizer_name):
                out.write(ids.astype(DTYPE).tobytes())
                n_tokens += len(ids)
        index = {"samples": n_tokens // block, "sample_tokens": block, "source": uri,
                 "tokenizer": tokenizer_name}
        with self.fs.open_output_stream(f"{self.directory}/{INDEX_FILE}") as f:
            f.write(json.dumps(index).encode())
        return index


def _token_stream(uri: str, tokenizer_name: str) -> Iterator[np.ndarray]:
    """The source's token ids in document order, in chunks (one Ray Data row per token)."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = ctx.print_on_execution_start = False  # a one-off, short step
    reader = ray.data.read_parquet if text_format(uri) == "parquet" else ray.data.read_json
    try:
        ds = reader(uri)
    except Exception as e:  # Ray wraps filesystem errors in many types; report the cause plainly
        raise DataError(f"--data {uri!r}: cannot read it ({str(e).splitlines()[0]})") from None
    if "text" not in (ds.schema().names if ds.schema() else []):
        raise DataError(f"--data {uri!r}: no `text` column (found {ds.schema()})")
    ds = ds.map_batches(lambda b: {"ids": tokenize(b["text"], tokenizer_name)}, batch_size=256,
                        batch_format="numpy")
    for batch in ds.iter_batches(batch_size=1 << 20, batch_format="numpy"):
        yield batch["ids"]
