"""Ray start-up shared by the job (`python -m training`) and the benchmark (`python -m bench`):
the local Ray's worker environment and start (a worker's rank and device: `training.run.worker`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # training/driver/ray_setup.py


def worker_env() -> dict[str, str]:
    """Environment for a local Ray's workers: the repository importable, Ray's chatter off."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "PYTHONWARNINGS": "ignore", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}


def init_ray(address: str | None) -> None:
    """Join the cluster at `address`, or start a local Ray with a couple of spare logical CPUs
    beside the train workers and the repository on the workers' import path."""
    import ray

    if address:
        ray.init(address=address, logging_level=logging.ERROR)
        return
    ray.init(num_cpus=(os.cpu_count() or 2) + 2, logging_level=logging.ERROR,
             runtime_env={"env_vars": worker_env()})

