"""Shared test helpers: where ../shared lives, skipping when it is absent, and the one local Ray
of the session (for the job and benchmark tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
KUBERAY_CRDS = SHARED / "reference" / "kuberay-v1.7.0"
SHARED_NCCL = SHARED / "fixtures" / "nccl"
NCCL_FIXTURES = REPO / "tests" / "fixtures" / "nccl"

# Every Ray the suite starts (the session's, the multi-node clusters' `ray start`, each
# `python -m training` subprocess) inherits this: its workers at the tests' own priority, not
# Ray's default nice 15, under which two busy CPU loops beside the suite leave them ~3% of a core.
os.environ.setdefault("RAY_worker_niceness", "0")
# ... and without the workers a raylet prestarts, one per CPU, when its first driver connects
# (ray 2.58 src/ray/common/ray_config_def.h `prestart_worker_first_driver`, true): most of them
# are never used here, yet each imports Ray, about 2 CPU-seconds a Ray the suite starts.
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
# One torch thread per process, as Ray gives each worker (OMP_NUM_THREADS=1 for a 1-CPU actor):
# two test processes with torch's default of a thread per core put four busy threads on two
# cores, and the OpenMP threads' spin-waits then take about a fifth of the in-process tests' CPU.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


def need(path: Path) -> Path:
    """`path`, or skip the test: upstream files are read from ../shared, never committed here."""
    if not path.exists():
        pytest.skip(f"{path} is absent (upstream reference files live in ../shared, not in this repo)")
    return path


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray shared by the job tests (starting one per test would triple the suite's time)."""
    import ray

    from training.driver import quiet

    quiet.install()
    from training.driver.ray_setup import worker_env

    # The controller polls workers every 2 s by default; faster polls, shorter tests.
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR",
             runtime_env={"env_vars": {**worker_env(), "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}})
    yield ray
    ray.shutdown()


# The suite's long runs (real Ray clusters, subprocess jobs, two-rank families), longest first.
# They go to the front of the queue the two test processes share (pytest.ini: -n 2, one test at
# a time), so that the short tests fill in last, instead of one long run ending the suite while
# the other core idles.
LONG_RUNS = ("training/run/test_preemption.py", "training/run/test_preemption_in_load.py",
             "training/run/test_repair_drain.py", "training/driver/test_job.py",
             "training/driver/test_interrupt.py",
             "bench/test_bench.py", "training/model/test_family_parity.py",
             "bench/test_preemption_poll.py")


def pytest_collection_modifyitems(items: list) -> None:
    def rank(item) -> int:
        path = item.path.relative_to(REPO / "tests").as_posix()
        return LONG_RUNS.index(path) if path in LONG_RUNS else len(LONG_RUNS)

    items.sort(key=rank)  # stable: the rest keep their order
