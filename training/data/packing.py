"""Which packed samples each rank reads: positions by count, so resumes are exact."""

from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs
import torch

from training.data import DataError
from training.data.cache import DTYPE, INDEX_FILE, TOKENS_FILE, TokenCache


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
            raw = self.file.read_at(take * self.width * DTYPE.itemsize,
                                    row * self.width * DTYPE.itemsize)
            out.extend(np.frombuffer(raw, dtype=DTYPE).reshape(take, self.width))
            i += take
        return np.stack(out).astype(np.int64)

    def batch(self, samples_seen: int, *, rank: int, world: int, micro: int,
              batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = sample_start(samples_seen, rank=rank, world=world, micro=micro, batch=batch)
        tokens = torch.from_numpy(self.rows(start, batch))
        return tokens[:, :-1], tokens[:, 1:]
