"""How the job starts on a cluster whose GPU nodes arrive late: the capacity wait, the run's start
record, and the EFA preflight's locked-memory warning."""

from __future__ import annotations

import os
import resource
import subprocess
import time

import pytest

from training.driver import cli
from training.network import transport
from training.config import ConfigError, TrainConfig

EIGHT_GPUS = TrainConfig(num_workers=8, use_gpu=True)


def arriving(*counts: int):
    """cluster_resources() as Ray answers it while GPU workers join: one answer per poll."""
    answers = iter(counts)
    last = {"CPU": 2.0}
    def resources() -> dict:
        nonlocal last
        gpus = next(answers, None)
        if gpus is not None:
            last = {"CPU": 2.0, **({"GPU": float(gpus)} if gpus else {})}
        return last
    return resources


def test_waits_with_a_progress_line_while_workers_join(capsys):
    waited = cli._check_capacity(EIGHT_GPUS, True, arriving(0, 4, 8), wait_s=60, poll_s=0.01)
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[1].split(" in ")[0].strip() for ln in lines] == ["0 of 8 GPUs",
                                                                         "4 of 8 GPUs"]
    assert all("at most 60 s" in ln for ln in lines) and waited > 0


def test_no_wait_when_the_workers_are_there(capsys):
    polls = []
    resources = arriving(8)
    cli._check_capacity(EIGHT_GPUS, True, lambda: polls.append(1) or resources(), wait_s=60,
                        poll_s=60)  # a second poll would sleep a minute
    assert len(polls) == 1 and capsys.readouterr().out == ""


def test_gives_up_after_the_timeout_with_what_to_check():
    with pytest.raises(cli.JobError, match=r"needs 8 GPUs but the Ray cluster has 4 after .*"
                                           r"kubectl -n ray get pods"):
        cli._check_capacity(EIGHT_GPUS, True, arriving(4), wait_s=0.05, poll_s=0.01)


def test_a_local_ray_fails_at_once():
    calls = []
    def resources() -> dict:
        calls.append(1)
        return {"CPU": 4.0}
    with pytest.raises(ConfigError, match="needs 8 GPUs but the Ray cluster has 0; lower"):
        cli._check_capacity(EIGHT_GPUS, True, resources, wait_s=0)
    assert len(calls) == 1


def test_the_run_counts_from_the_heads_start_record(tmp_path, monkeypatch):
    record = tmp_path / "run-started-at"
    monkeypatch.setenv(cli.RUN_STARTED_ENV, str(record))
    now = time.time()
    assert cli._run_started_at(now) == now  # not written yet: the job's own start
    record.write_text("garbage")
    assert cli._run_started_at(now) == now
    record.write_text(f"{int(now) - 300}\n")
    assert cli._run_started_at(now) == int(now) - 300
    monkeypatch.delenv(cli.RUN_STARTED_ENV)
    assert cli._run_started_at(now) == now  # a local run


def test_the_heads_poststart_hook_writes_what_the_job_reads(tmp_path, monkeypatch):
    """The contract between workloads/raycluster.py (writer) and training/driver/cli.py (reader)."""
    from tests.workloads.test_manifests import containers, env, stack
    from workloads.raycluster import RUN_STARTED_FILE, build_cluster_spec

    head = containers(build_cluster_spec(stack()), "head")
    path = env(head)[cli.RUN_STARTED_ENV]
    assert path == RUN_STARTED_FILE and path.startswith(
        next(m["mountPath"] for m in head["volumeMounts"] if m["name"] == "ray-logs"))
    hook = head["lifecycle"]["postStart"]["exec"]["command"]
    record = tmp_path / "run-started-at"
    local = [part.replace(RUN_STARTED_FILE, str(record)) for part in hook]
    before = time.time()
    subprocess.run(local, check=True)
    monkeypatch.setenv(cli.RUN_STARTED_ENV, str(record))
    started = cli._run_started_at(time.time() + 60)
    assert int(before) <= started <= time.time()
    record.write_text("1")  # a container restart keeps the pod's first start
    subprocess.run(local, check=True)
    assert record.read_text() == "1"


def test_memlock_below_unlimited_warns_with_the_fix_and_does_not_fail(monkeypatch, capsys):
    monkeypatch.setattr(transport.glob, "glob", lambda pattern: ["/dev/infiniband/uverbs0"]
                        if "uverbs" in pattern else [])
    monkeypatch.setattr(transport.shutil, "which", lambda name: None)  # no fi_info probe
    monkeypatch.setattr(transport.resource, "getrlimit", lambda which: (8 << 20, 8 << 20))
    assert transport.efa_preflight() == []
    out = capsys.readouterr().out
    assert "WARNING: locked-memory limit is 8388608 bytes" in out and "RLIMIT_MEMLOCK" in out
    monkeypatch.setattr(transport.resource, "getrlimit",
                        lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert transport.memlock_warning() is None


@pytest.mark.parametrize("set_by_user, expected", [(None, "0"), ("10", "10")])
def test_a_local_ray_starts_its_workers_at_the_drivers_priority(monkeypatch, set_by_user,
                                                                expected):
    """The raylet ray.init starts inherits the driver's environment and reads its niceness for
    the workers from RAY_worker_niceness (default 15); a user's own value is kept."""
    import ray

    from training.driver import ray_setup

    seen = {}
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    if set_by_user:
        monkeypatch.setenv("RAY_worker_niceness", set_by_user)
    monkeypatch.setattr(ray, "init", lambda **_: seen.update(
        niceness=os.environ.get("RAY_worker_niceness")))
    ray_setup.init_ray(None)
    assert seen == {"niceness": expected}
    seen.clear()
    monkeypatch.delenv("RAY_worker_niceness")
    ray_setup.init_ray("10.0.0.1:6379")  # a cluster's Ray: its nodes keep Ray's own setting
    assert seen == {"niceness": None}
