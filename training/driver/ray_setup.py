"""Ray start-up shared by the job (`python -m training`) and the benchmark (`python -m bench`):
the local Ray's worker environment and start (a worker's rank and device: `training.run.worker`),
and the job's TorchTrainer, which remembers a Ctrl-C."""

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
    local_workers_at_driver_priority()
    ray.init(num_cpus=(os.cpu_count() or 2) + 2, logging_level=logging.ERROR,
             runtime_env={"env_vars": worker_env()})


def local_workers_at_driver_priority() -> None:
    """Start a local Ray's workers at the driver's priority. The raylet nices every worker it
    starts to 15 (ray 2.58 src/ray/common/ray_config_def.h `worker_niceness`, read from
    RAY_worker_niceness), so that a cluster node's raylet and agents stay responsive; on a laptop
    or CI machine where the workers ARE the run, any other busy process then takes nearly all
    the CPU from them (CFS weight 36 against 1024), and the run crawls while its driver's waits
    count down. Ray's own job manager starts job drivers at 0 for the same reason
    (ray/dashboard/modules/job/job_manager.py). A value the user set is kept."""
    os.environ.setdefault("RAY_worker_niceness", "0")


def torch_trainer():
    """Ray Train's TorchTrainer without Ray Data when it is given no datasets (the job's is never
    given any: each rank reads its own rows, training.data; nor is the benchmark's). Ray 2.58
    adds a DatasetsCallback to every run (train/v2/api/data_parallel_trainer.py
    `_create_default_callbacks`), whose DatasetManager actor is one more worker process per
    attempt that does nothing here. (The autoscaling coordinator actor stays: Train's scaling
    policy starts it to ask a cluster's autoscaler for the workers' resources.)"""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

    class Trainer(TorchTrainer):
        def _create_default_callbacks(self) -> list:
            callbacks = super()._create_default_callbacks()
            if self.datasets:
                return callbacks
            return [c for c in callbacks if not isinstance(c, DatasetsCallback)]

    return Trainer


def interruptible_trainer():
    """`torch_trainer()` that remembers a Ctrl-C. Its `fit` swaps in a SIGINT handler that
    aborts the controller and calls sys.exit(0) (ray 2.58 train/v2/api/data_parallel_trainer.py
    `_register_sigint_handler`), so the run ends with a bare exit status 1 and no word of what
    was saved; this wraps that handler to record the interrupt first, and cli._fit turns it back
    into a KeyboardInterrupt that the driver's `main` reports."""
    import signal

    class InterruptibleTrainer(torch_trainer()):
        interrupted = False

        def _register_sigint_handler(self, controller) -> None:
            super()._register_sigint_handler(controller)
            ray_handler = signal.getsignal(signal.SIGINT)

            def on_sigint(signum, frame):
                self.interrupted = True
                ray_handler(signum, frame)

            signal.signal(signal.SIGINT, on_sigint)

    return InterruptibleTrainer
