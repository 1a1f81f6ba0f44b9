"""Which packed samples each rank reads (positions by count, so resumes are exact), and what a
packed sample means to the model: labels only where the loss trains, positions that restart at
every document, so that attention never crosses a document boundary (transformers builds a
block-diagonal mask from such positions when the attention mask is None: model.py)."""

from __future__ import annotations

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


class Samples:
    """Random access to the packed samples of a TokenCache file (a worker reads only what it
    trains on)."""

    def __init__(self, fs: pafs.FileSystem, directory: str, file: str = TOKENS_FILE,
                 count_key: str = "samples"):
        index = TokenCache(fs, directory, "").index()
        if index is None:
            raise DataError(f"tokenized data {directory} is incomplete (no index.json)")
        self.n, self.width = index[count_key], index["sample_tokens"]
        if self.n < 1:
            raise DataError("the data holds no full sample; add data or lower --seq-len")
        self.file = fs.open_input_file(f"{directory}/{file}")

    def rows(self, start: int, count: int) -> np.ndarray:
        """Samples start .. start+count-1 (wrapping around at the end: the next epoch)."""
        out, i = [], start
        while len(out) < count:
            row = i % self.n
            take = min(count - len(out), self.n - row)
            raw = self.file.read_at(take * self.width * DTYPE.itemsize,
                                    row * self.width * DTYPE.itemsize)
            out.extend(np.frombuffer(raw, dtype=DTYPE).reshape(take, self.width))
            i += take
        return np.stack(out)

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
