"""The tokenized, packed form of a run's data in the run directory, named by a fingerprint of its
source, tokenizer and packing settings.

Built once on the driver, before Ray starts (so every bad row is reported with its file and row
first), in the source's file and row order. A row that cannot be trained on (formats.py says
why) is skipped and counted, its first few reasons kept in the index for the log, unless more
than SKIP_SHARE of the rows are: then the data is refused, naming them. One odd row of a public
set never ends a paid run; a set that is mostly not what it seems does, before anything starts. Documents are concatenated and cut into
`seq_len + 1`-token samples; each token is a uint32 whose low 30 bits are its id and whose high
bits say whether the loss trains on it and whether it starts a document (packing.py turns them
into labels and per-document positions). `--eval-fraction` holds out a deterministic set of
documents, written to their own file and never trained on. `index.json` is written last.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

import numpy as np
import pyarrow.fs as pafs

from training.data import DataError
from training.data.formats import Format, RowError, detect
from training.data.source import Source
from training.data.tokenize import Encoder

INDEX_FILE = "index.json"
TOKENS_FILE, EVAL_FILE = "tokens.u32", "eval.u32"
DTYPE = np.dtype("<u4")
TRAINED, START = np.uint32(1 << 31), np.uint32(1 << 30)
ID_MASK = (1 << 30) - 1
LAYOUT = 2  # of the token file: 1 had bare ids; a cache of another layout is never reused
SKIP_SHARE = 0.01  # of the rows: more that cannot train, and the data is refused
SKIP_EXAMPLES = 3  # reasons kept for the log and the index


def held_out(document: int, fraction: float) -> bool:
    """Whether document `document` (0-based, in source order) is in the evaluation split: a
    multiplicative (golden-ratio) hash spreads the held-out documents evenly through the data."""
    return fraction > 0 and ((document * 0x9E3779B1) & 0xFFFFFFFF) / 2**32 < fraction


def fingerprint(source: Source, tokenizer_name: str, seq_len: int, loss_tokens: str = "completion",
                eval_fraction: float = 0.0) -> str:
    """Changes with the data's contents (source.py: `identity`) and every setting that shapes the
    tokenized form."""
    where = None if isinstance(source.fs, pafs.LocalFileSystem) else source.uri
    key = json.dumps([LAYOUT, where, tokenizer_name, seq_len, loss_tokens, eval_fraction,
                      source.identity()])
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class _Packed:
    """An output stream of packed tokens; counts what it holds."""

    def __init__(self, fs: pafs.FileSystem, path: str):
        self.out = fs.open_output_stream(path)
        self.tokens = self.documents = 0

    def add(self, ids: list[int], trained: list[bool]) -> None:
        flags = np.where(np.asarray(trained), TRAINED, np.uint32(0))
        flags[0] |= START
        self.out.write((np.asarray(ids, dtype=DTYPE) | flags).astype(DTYPE).tobytes())
        self.tokens += len(ids)
        self.documents += 1

    def close(self, block: int, pad: bool) -> int:
        """Samples held; `pad` fills the last partial sample with untrained document starts
        (evaluation keeps its every document), otherwise the tail is left unread."""
        if pad and self.tokens % block:
            fill = block - self.tokens % block
            self.out.write(np.full(fill, START, dtype=DTYPE).tobytes())
            self.tokens += fill
        self.out.close()
        return self.tokens // block


@dataclass
class Skipped:
    """The rows a build could not train on: how many of how many, and the first reasons."""
    rows: int = 0
    of: int = 0
    reasons: list[str] = field(default_factory=list)

    def add(self, reason: str) -> None:
        self.rows += 1
        if len(self.reasons) < SKIP_EXAMPLES:
            self.reasons.append(reason)

    def check(self) -> None:
        """Refuse the data when more than max(1 row, SKIP_SHARE of its rows) cannot train (one
        odd row never ends a run, however small the file), or when none can."""
        if self.rows and (self.rows == self.of or self.rows > max(1.0, SKIP_SHARE * self.of)):
            raise DataError(f"{'; '.join(self.reasons)} ({self.rows} of {self.of} rows cannot "
                            f"be trained on, more than the {SKIP_SHARE:.0%} (or one row) a run "
                            "skips)")

    def index(self) -> dict:
        """The cache index's record of the skipped rows (prepare.describe logs it)."""
        return {"skipped_rows": self.rows, "skipped_reasons": self.reasons}


T = TypeVar("T")


def encoded_rows(source: Source, encode: Callable[[dict], T],
                 skipped: Skipped) -> Iterator[tuple[str, int, T]]:
    """(file, row number, `encode(row)`) of every row in order; a row `encode` refuses
    (RowError) goes to `skipped` with its file and row. SFT's documents and DPO's pairs both
    come through here, so a bad row is skipped and counted the same way for either."""
    for where, number, row in source.rows():
        skipped.of += 1
        try:
            encoded = encode(row)
        except RowError as e:
            skipped.add(f"{where} row {number}: {e}")
            continue
        yield where, number, encoded


def sft_encoder(enc: Encoder, loss_tokens: str) -> Callable[[dict], tuple[Format, list[int],
                                                                          list[bool]]]:
    """A row's (format, ids, trained flags), the format told from the first row that has one."""
    fmt = None

    def encode(row: dict) -> tuple[Format, list[int], list[bool]]:
        nonlocal fmt
        fmt = fmt or detect(list(row))
        return fmt, *fmt.encode_row(row, enc, loss_tokens)
    return encode


def documents(source: Source, enc: Encoder, loss_tokens: str, skipped: Skipped) -> Iterator[
        tuple[str, int, Format, list[int], list[bool]]]:
    """(file, row number, format, ids, trained flags) of every row that can train, in order."""
    for where, number, (f, ids, trained) in encoded_rows(source, sft_encoder(enc, loss_tokens),
                                                         skipped):
        yield where, number, f, ids, trained


def held_out_rows(source: Source, encode: Callable[[dict], object],
                  fraction: float) -> Iterator[dict]:
    """The rows of the evaluation split, in order: of the rows `encode` accepts (the skipped
    ones left out, as a build skips them), those whose count `held_out` holds out. The one
    definition the cache's split, --sample-prompts and the shipped lm-eval task share."""
    accepted = encoded_rows(source, lambda row: (row, encode(row)), Skipped())
    for n, (_, _, (row, _)) in enumerate(accepted):
        if held_out(n, fraction):
            yield row


@dataclass(frozen=True)
class TokenCache:
    """The tokenized, packed samples of one run's data in `directory` on `fs`."""
    fs: pafs.FileSystem
    directory: str
    fingerprint: str

    @classmethod
    def for_run(cls, fs: pafs.FileSystem, run_dir: str, source: Source, tokenizer_name: str,
                seq_len: int, loss_tokens: str = "completion",
                eval_fraction: float = 0.0) -> "TokenCache":
        fp = fingerprint(source, tokenizer_name, seq_len, loss_tokens, eval_fraction)
        return cls(fs, f"{run_dir}/tokens-{fp}", fp)

    def index(self) -> dict | None:
        path = f"{self.directory}/{INDEX_FILE}"
        if self.fs.get_file_info(path).type == pafs.FileType.NotFound:
            return None
        with self.fs.open_input_stream(path) as f:
            return json.loads(f.read())

    def build(self, source: Source, enc: Encoder, seq_len: int, loss_tokens: str = "completion",
              eval_fraction: float = 0.0, pad: bool = False) -> dict:
        """Tokenize and pack `source` here; reused when present. `pad` keeps the last partial
        sample (for a set that is only evaluated)."""
        if (existing := self.index()) is not None:
            return existing
        self.fs.create_dir(self.directory, recursive=True)
        try:
            index = self._pack(source, enc, seq_len + 1, loss_tokens, eval_fraction, pad)
        except BaseException:
            self.fs.delete_dir(self.directory)  # nothing half-written stays behind
            raise
        with self.fs.open_output_stream(f"{self.directory}/{INDEX_FILE}") as f:
            f.write(json.dumps(index).encode())
        return index

    def _pack(self, source: Source, enc: Encoder, block: int, loss_tokens: str,
              eval_fraction: float, pad: bool) -> dict:
        train = _Packed(self.fs, f"{self.directory}/{TOKENS_FILE}")
        held = _Packed(self.fs, f"{self.directory}/{EVAL_FILE}")
        fmt, max_id, trained_tokens, skipped = None, -1, 0, Skipped()
        for doc, (where, number, fmt, ids, trained) in enumerate(documents(source, enc,
                                                                           loss_tokens, skipped)):
            max_id = max(max_id, max(ids))
            if max_id > ID_MASK:
                raise DataError(f"{where} row {number}: token id {max_id} is beyond the "
                                f"{ID_MASK + 1:,} this cache can hold")
            (held if held_out(doc, eval_fraction) else train).add(ids, trained)
            trained_tokens += sum(trained)
        skipped.check()
        return {"samples": train.close(block, pad), "eval_samples": held.close(block, True),
                "sample_tokens": block, "source": source.uri,
                "data_format": fmt.name if fmt else None,
                "documents": train.documents, "eval_documents": held.documents,
                "max_token_id": max_id, "loss_tokens": loss_tokens,
                "trained_tokens": trained_tokens, **skipped.index()}
