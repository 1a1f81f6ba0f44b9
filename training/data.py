"""Training batches: deterministic random tokens, or text tokenized once into an indexed file.

Random tokens (the reference's mode) are a pure function of (seed, rank, step, micro-batch), so a
resumed run sees exactly the batches it would have seen.

Text is tokenized once per run by Ray Data on the cluster and packed, on the driver, into
`seq_len + 1`-token samples in a fixed order (Ray Data's `preserve_order`; directories are listed
sorted, ray/data/datasource/file_meta_provider.py `_list_files`). The samples go into
`tokens-<fingerprint>/` in the run directory: a flat uint32 file and `index.json`, written last.
Sample `i` is row `i mod n` of that file, so the stream of samples is a pure function of how many
the run has consumed (`samples_seen`, saved in every checkpoint): a resume reads from there with
any world size or micro-batch, covers every sample once per epoch, and tokenizes nothing again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow.fs as pafs
import torch

RANDOM_MODES = ("random", "repeat")
BYTES = "bytes"  # built-in tokenizer: UTF-8 bytes, end-of-text 256 (no download, for the demo)
BYTES_VOCAB = 257
INDEX_FILE, TOKENS_FILE = "index.json", "tokens.u32"
_DTYPE = np.dtype("<u4")


class DataError(ValueError):
    """The --data source cannot feed training."""


def random_batch(*, seed: int, rank: int, step: int, micro: int, batch: int, seq_len: int,
                 vocab: int, repeat: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of shape [batch, seq_len]; `repeat` returns the same batch every step."""
    key = (seed, rank) if repeat else (seed, rank, step, micro)
    g = torch.Generator().manual_seed(hash(key) & 0x7FFF_FFFF_FFFF_FFFF)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def text_format(uri: str) -> str:
    """`json` or `parquet`, from the path's suffix (a directory is read as jsonl)."""
    return "parquet" if uri.rstrip("/").lower().endswith(".parquet") else "json"


def tokenize(texts, tokenizer_name: str) -> np.ndarray:
    """Token ids of the documents, each followed by the end-of-text id, concatenated."""
    if tokenizer_name == BYTES:
        encode, eos = str.encode, BYTES_VOCAB - 1
    else:
        tok = _hf_tokenizer(tokenizer_name)
        encode = functools.partial(tok.encode, add_special_tokens=False)
        eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    ids: list[int] = []
    for text in texts:
        ids.extend(encode(str(text)))
        ids.append(eos)
    return np.asarray(ids, dtype=np.int64)


@functools.cache
def _hf_tokenizer(name: str):
    """Loaded once per Ray Data worker process, not once per batch."""
    from transformers import AutoTokenizer

    from training.loading import local_dir

    return AutoTokenizer.from_pretrained(local_dir(name))  # s3://: its files, copied here


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
                out.write(ids.astype(_DTYPE).tobytes())
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


def sample_start(samples_seen: int, *, rank: int, world: int, micro: int, batch: int) -> int:
    """Global index of the first sample of `rank`'s micro-batch `micro` in the optimizer step
    that begins after `samples_seen` samples; a step consumes `world * grad_accum * batch`."""
    return samples_seen + (micro * world + rank) * batch


class Samples:
    """Random access to a TokenCache's packed samples (a worker reads only what it trains on)."""

    def __init__(self, fs: pafs.FileSystem, directory: str):
        index = TokenCache(fs, directory, "").index()
        if index is None:
            raise DataError(f"tokenized data {directory} is incomplete (no {INDEX_FILE})")
        self.n, self.width = index["samples"], index["sample_tokens"]
        if self.n < 1:
            raise DataError("the text holds no full sample; add text or lower --seq-len")
        self.file = fs.open_input_file(f"{directory}/{TOKENS_FILE}")

    def rows(self, start: int, count: int) -> np.ndarray:
        """Samples start .. start+count-1 (wrapping around at the end: the next epoch)."""
        out, i = [], start
        while len(out) < count:
            row = i % self.n
            take = min(count - len(out), self.n - row)
            raw = self.file.read_at(take * self.width * _DTYPE.itemsize,
                                    row * self.width * _DTYPE.itemsize)
            out.extend(np.frombuffer(raw, dtype=_DTYPE).reshape(take, self.width))
            i += take
        return np.stack(out).astype(np.int64)

    def batch(self, samples_seen: int, *, rank: int, world: int, micro: int,
              batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = sample_start(samples_seen, rank=rank, world=world, micro=micro, batch=batch)
        tokens = torch.from_numpy(self.rows(start, batch))
        return tokens[:, :-1], tokens[:, 1:]
