"""Deterministic random tokens (the reference's mode): a pure function of (seed, rank, step,
micro-batch), so a resumed run sees exactly the batches it would have seen."""

from __future__ import annotations

import torch


def random_batch(*, seed: int, rank: int, step: int, micro: int, batch: int, seq_len: int,
                 vocab: int, repeat: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of shape [batch, seq_len]; `repeat` returns the same batch every step."""
    key = (seed, rank) if repeat else (seed, rank, step, micro)
    g = torch.Generator().manual_seed(hash(key) & 0x7FFF_FFFF_FFFF_FFFF)
    tokens = torch.randint(0, vocab, (batch, seq_len + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]
