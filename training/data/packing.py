"""Which packed samples each rank reads (positions by count, so resumes are exact), and what a
packed sample means to the model: labels only where the loss trains, positions that restart at
every document, so that attention never crosses a document boundary (transformers builds a
block-diagonal mask from such positions when the attention mask is None: model.py).

Training reads the documents in a new seeded order every epoch (`EpochOrder`), as HF Trainer's
and TRL's seeded samplers reshuffle every epoch; evaluation reads the file in order.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import NamedTuple

import numpy as np
import pyarrow.fs as pafs
import torch

from training.data import DataError
from training.data.cache import DTYPE, ID_MASK, START, TOKENS_FILE, TRAINED, TokenCache
from training.model.loss import IGNORE_INDEX


class Batch(NamedTuple):
    """One micro-batch: inputs, labels (IGNORE_INDEX where not trained) and per-document
    positions (None: one document per row, positions 0..seq_len-1)."""
    inputs: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor | None = None

    def to(self, device: torch.device) -> "Batch":
        return Batch(*(None if t is None else t.to(device, non_blocking=True) for t in self))


def sample_start(samples_seen: int, *, rank: int, world: int, micro: int, batch: int) -> int:
    """Global index of the first sample of `rank`'s micro-batch `micro` in the optimizer step
    that begins after `samples_seen` samples; a step consumes `world * grad_accum * batch`."""
    return samples_seen + (micro * world + rank) * batch


def decode(rows: np.ndarray) -> Batch:
    """A Batch from packed samples ([batch, seq_len + 1] uint32, cache.py's layout). A label is
    trained when its token is, unless it starts a document (nothing in the row predicts it);
    a row's first token starts a position run, as a document does."""
    ids = torch.from_numpy((rows & ID_MASK).astype(np.int64))
    trained = torch.from_numpy((rows & TRAINED) != 0)
    start = torch.from_numpy((rows & START) != 0)
    labels = ids[:, 1:].masked_fill(~trained[:, 1:] | start[:, 1:], IGNORE_INDEX)
    begins = start[:, :-1].clone()
    begins[:, 0] = True
    index = torch.arange(begins.shape[1]).expand_as(begins)
    last_begin = torch.where(begins, index, 0).cummax(dim=1).values
    return Batch(ids[:, :-1], labels, index - last_begin)


_M32 = (1 << 32) - 1


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number
    generators", 2014): a bijection of uint64 that scatters consecutive inputs. Integer
    arithmetic, so the order is the same on every numpy (no RNG stream to change)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class EpochOrder:
    """Epoch e's samples: every document of the file, in the order of a hash of (seed, e,
    document), concatenated and cut into rows of `width` tokens (the epoch's last partial row is
    left unread). Sample k of epoch e is a pure function of (seed, e, k): a resume on any number
    of workers continues the same order."""

    def __init__(self, tokens: np.ndarray, width: int, seed: int):
        self.tokens, self.width, self.seed = tokens, width, seed
        self.starts = np.flatnonzero(tokens & START)
        self.lengths = np.diff(np.append(self.starts, len(tokens)))
        self._epoch: int | None = None

    def order(self, epoch: int) -> np.ndarray:
        """The documents of epoch `epoch`, in reading order."""
        salt = _mix(np.array([(self.seed & _M32) << 32 | (epoch & _M32)], dtype=np.uint64))
        return np.argsort(_mix(np.arange(len(self.starts), dtype=np.uint64) ^ salt), kind="stable")

    def row(self, epoch: int, k: int) -> np.ndarray:
        if epoch != self._epoch:  # consecutive reads stay in one epoch: ordered once
            self._perm = self.order(epoch)
            self._ends = np.cumsum(self.lengths[self._perm])
            self._epoch = epoch
        at, end = k * self.width, (k + 1) * self.width
        j, parts = int(np.searchsorted(self._ends, at, side="right")), []
        while at < end:  # the documents (or parts) that fill the row
            doc = self._perm[j]
            offset = at - (self._ends[j] - self.lengths[doc])
            take = min(end - at, self.lengths[doc] - offset)
            parts.append(self.tokens[self.starts[doc] + offset:][:take])
            at, j = at + take, j + 1
        return np.concatenate(parts)


def _mapped(fs: pafs.FileSystem, path: str) -> np.ndarray:
    """A token file as a read-only memory map: in place on a local filesystem, else copied once
    to a local temporary file (shuffled documents would cost one S3 request each)."""
    local = path
    if not isinstance(fs, pafs.LocalFileSystem):
        fd, local = tempfile.mkstemp(prefix="tokens-", suffix=".u32")
        with fs.open_input_stream(path) as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, 64 * 2**20)
    try:
        return np.memmap(local, dtype=DTYPE, mode="r") if os.path.getsize(local) \
            else np.zeros(0, dtype=DTYPE)
    finally:
        if local != path:
            os.unlink(local)  # the map keeps its pages until the worker exits


class Samples:
    """Random access to the packed samples of a TokenCache file. With a `seed` (training), the
    documents in a new order each epoch (EpochOrder); without (evaluation), the file's rows."""

    def __init__(self, fs: pafs.FileSystem, directory: str, file: str = TOKENS_FILE,
                 count_key: str = "samples", seed: int | None = None):
        index = TokenCache(fs, directory, "").index()
        if index is None:
            raise DataError(f"tokenized data {directory} is incomplete (no index.json)")
        self.n, self.width = index[count_key], index["sample_tokens"]
        if self.n < 1:
            raise DataError("the data holds no full sample; add data or lower --seq-len")
        self.tokens = _mapped(fs, f"{directory}/{file}")
        self.order = None if seed is None else EpochOrder(self.tokens, self.width, seed)

    def rows(self, start: int, count: int) -> np.ndarray:
        """Samples start .. start+count-1, counted across epochs (sample i is row i % n of
        epoch i // n)."""
        picks = range(start, start + count)
        if self.order is not None:
            return np.stack([self.order.row(i // self.n, i % self.n) for i in picks])
        rows = self.tokens[:self.n * self.width].reshape(self.n, self.width)
        return rows[[i % self.n for i in picks]]

    def batch(self, samples_seen: int, *, rank: int, world: int, micro: int,
              batch: int) -> Batch:
        start = sample_start(samples_seen, rank=rank, world=world, micro=micro, batch=batch)
        return decode(self.rows(start, batch))

    def eval_batches(self, *, rank: int, world: int, batch: int) -> list[Batch]:
        """Every sample once, strided over the ranks; each rank gets the same number of
        micro-batches (FSDP's forward is collective), the shortfall as rows with no label."""
        per_rank = -(-self.n // world)
        steps = -(-per_rank // batch)
        every, out = self.rows(0, self.n), []
        for s in range(steps):
            picks = [rank + world * (s * batch + b) for b in range(batch)]
            rows = every[[min(p, self.n - 1) for p in picks]].copy()
            rows[[p >= self.n for p in picks]] &= ~TRAINED  # padding: nothing is counted
            out.append(decode(rows))
        return out


Pair = tuple[tuple[list[int], list[bool]], tuple[list[int], list[bool]]]


def row_of(pairs: list[Pair], width: int) -> np.ndarray:
    """One pair row (cache.py's token layout): each pair's chosen document, then its rejected
    one, pair after pair, then untrained document starts (no label, a position of their own)
    to `width`: documents 2k and 2k+1 of a row are its pair k (model/dpo.py `pair_logps`)."""
    row = np.full(width, START, dtype=DTYPE)
    at = 0
    for pair in pairs:
        for ids, trained in pair:
            flags = np.where(np.asarray(trained), TRAINED, np.uint32(0))
            flags[0] |= START
            row[at:at + len(ids)] = np.asarray(ids, dtype=DTYPE) | flags
            at += len(ids)
    return row


class PairRows:
    """An output stream of pair rows: as many whole pairs in a row as fit, in order (a pair is
    never split, so never across micro-batches or workers), padding only at a row's end, as
    SFT's documents fill theirs. Counts what it holds."""

    def __init__(self, fs: pafs.FileSystem, path: str, width: int):
        self.out, self.width = fs.open_output_stream(path), width
        self.row: list[Pair] = []
        self.at = self.rows = self.pairs = self.tokens = self.trained = self.pairs_per_row = 0
        self.max_id = -1

    def add(self, pair: Pair) -> None:
        size = sum(len(ids) for ids, _ in pair)
        if self.at + size > self.width:
            self._flush()
        self.row.append(pair)
        self.at += size
        self.pairs += 1
        self.tokens += size
        self.trained += sum(sum(t) for _, t in pair)
        self.max_id = max(self.max_id, *pair[0][0], *pair[1][0])

    def _flush(self) -> None:
        if self.row:
            self.out.write(row_of(self.row, self.width).tobytes())
            self.rows += 1
            self.pairs_per_row = max(self.pairs_per_row, len(self.row))
        self.row, self.at = [], 0

    def close(self) -> dict:
        self._flush()
        self.out.close()
        return {"rows": self.rows, "pairs": self.pairs, "tokens": self.tokens,
                "trained": self.trained, "pairs_per_row": max(self.pairs_per_row, 1),
                "max_id": self.max_id}
