"""The random numbers a step draws (dropout: `--lora-dropout`, a model's own dropout), from
(seed, step, rank) alone.

Seeded at every step, a resumed attempt draws at step N what an uninterrupted run drew there,
whatever the process did before (loading, evaluation, a restart), so a run with dropout resumes
bitwise as one without does; no generator state needs checkpointing, and a resume with another
world size stays well defined (each rank's stream is its own). `torch.manual_seed` seeds the CPU
generator and every CUDA device's (torch/random.py: it calls `torch.cuda.manual_seed_all`);
activation checkpointing replays the same draws in its recompute (`preserve_rng_state`).
"""

from __future__ import annotations

import hashlib

import torch


def step_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit seed of its own for each (run seed, step, rank)."""
    digest = hashlib.sha256(f"{seed}/{step}/{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed every torch generator for this rank's step `step`."""
    torch.manual_seed(step_seed(seed, step, rank))
