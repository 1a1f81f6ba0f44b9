"""Run a function on N in-process ranks of a real gloo group (torch.multiprocessing, no Ray):
FSDP2, DCP and the training step exactly as the job runs them, at a fraction of a Ray run's cost.

The ranks fork from one fork server per test process, which imports torch, transformers and the
job's step code once (`PRELOAD`): a spawned rank re-imports them, several CPU-seconds a rank on
two cores, paid by every call. The fork server is a fresh interpreter (no Ray or gRPC threads of
the test process to inherit); what a spawned rank would have taken from the test process at the
call, its environment and working directory, each rank is handed and sets first."""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.ports import free_port

PRELOAD = ["torch", "torch.distributed.checkpoint", "transformers", "peft",
           "training.step.engine", "training.run.checkpoint"]


def _worker(rank: int, world: int, port: int, out_dir: str, env: dict, cwd: str, fn: Callable,
            args: tuple) -> None:
    os.environ.clear()
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.chdir(cwd)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.save(fn(*args), Path(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def start(fn: Callable, args: tuple, nprocs: int) -> None:
    """`fn(rank, *args)` in `nprocs` processes forked from the preloaded fork server (set up on
    first use; a preload set later has no effect, so every caller goes through here)."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def run_ranks(world: int, fn: Callable, *args) -> list:
    """`fn(*args)` on `world` ranks of a gloo group; returns each rank's result."""
    with tempfile.TemporaryDirectory() as out:
        start(_worker, (world, free_port(), out, dict(os.environ), os.getcwd(), fn, args), world)
        return [torch.load(Path(out, f"rank{r}.pt"), weights_only=False) for r in range(world)]
