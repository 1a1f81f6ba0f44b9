"""Where a Ray Train worker is: its ranks and its device, shared by the job's loop and the
benchmark's workers."""

from __future__ import annotations


def worker_context():
    """(world rank, world size, local rank, device) of this Ray Train worker, device made current."""
    import ray.train
    import ray.train.torch
    import torch

    ctx = ray.train.get_context()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank(), device
