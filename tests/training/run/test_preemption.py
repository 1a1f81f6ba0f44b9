"""Spot preemptions on a real Ray cluster of several nodes on this machine: a head that holds no
workers (as on EKS) and worker nodes that come and go as spot nodes do.

One run is preempted twice: first by `ray drain-node` for preemption with a deadline while it is
held at step 3 (it saves step 3 and resumes from it), then by SIGTERM to its node's `ray start
--block` (a pod's eviction on KubeRay, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S) while step 6's
asynchronous save never finishes (it falls back to step 4, the newest complete checkpoint). Each
time a replacement node joins, as EKS's capacity rebalancing or cluster-autoscaler brings one.
It ends with the uninterrupted run's losses and weights, with --max-failures 0: the preemptions
drew on their own budget.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.conftest import REPO
from tests.ports import free_port
from training.run.checkpoint import MARKER, dir_name

RAY = str(Path(sys.executable).parent / "ray")
TAG = "EKS_RAY_TRAIN_TEST_CLUSTER"  # in every process of the cluster: how teardown finds them
NOTICE_S = 60  # the first drain's deadline: > RESTART_MARGIN_S + a notice + a save on a loaded
# machine; no slower when quiet: once saved, the run brings the deadline to now (preemption.py)
SIGTERM_DRAIN_S = 15  # the second's (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S): its save stalls
JOB = ["--model", "tiny", "--num-workers", "2", "--no-use-gpu", "--steps", "10",
       "--checkpoint-every", "2", "--log-every", "1", "--seq-len", "32", "--max-failures", "0"]


class Cluster:
    """`ray start --block` processes, each in a session of its own, all tagged."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, TAG: str(root), "RAY_ADDRESS": self.address,
                    "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore",
                    "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
                    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
                    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
        self.procs: list[subprocess.Popen] = []
        head = self._start(["--head", "--port", str(self.port), "--num-cpus", "0",
                            "--include-dashboard", "false", "--temp-dir", str(root / "ray")],
                           "head")
        if not self._up(head, "head"):  # its GCS did not come up: say why, not a node's timeout
            raise AssertionError(f"the head did not start:\n{self._log('head')[-2000:]}")

    def _start(self, args: list[str], name: str, env: dict | None = None) -> subprocess.Popen:
        ports = [flag for key in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                  "--metrics-export-port", "--runtime-env-agent-port")
                 for flag in (key, str(free_port()))]
        proc = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *args, *ports],
                                env={**self.env, **(env or {})}, start_new_session=True,
                                stdout=open(self.root / f"{name}.log", "w"),
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def add_node(self, tries: int = 3, **env: str) -> subprocess.Popen:
        """A worker node with room for the run's two workers, once it has joined (`ray start`
        logs that it blocks); `env`: more of its environment, which its workers inherit. On a
        busy machine a raylet can time out starting and its `ray start` exits: again, up to
        `tries` times."""
        for _ in range(tries):
            name = f"node{len(self.procs)}"
            proc = self._start(["--address", self.address, "--num-cpus", "2"], name,
                               {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": str(SIGTERM_DRAIN_S),
                                **env})
            if self._up(proc, name):
                return proc
        raise AssertionError(f"a node did not join in {tries} tries:\n{self._log(name)[-2000:]}")

    def _log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()

    def _up(self, proc: subprocess.Popen, name: str) -> bool:
        """Whether `ray start` got to blocking (its node is in the cluster) rather than exit."""
        while proc.poll() is None and "block forever" not in self._log(name):
            time.sleep(0.5)
        return proc.poll() is None

    def drain(self, node_id: str, deadline_s: int) -> None:
        subprocess.run([RAY, "drain-node", "--address", self.address, "--node-id", node_id,
                        "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message",
                        "spot reclaim (test)", "--deadline-remaining-seconds", str(deadline_s)],
                       env=self.env, check=True, capture_output=True, timeout=120)

    def job(self, storage: Path, name: str, *flags: str, here: bool = True) -> subprocess.Popen:
        """`python -m training` on this cluster, or (`here` False) on a local Ray of its own."""
        where = ["--address", self.address] if here else []
        job = subprocess.Popen(
            [sys.executable, "-m", "training", *where, "--storage-path", str(storage), "--name",
             name, *JOB, *flags], cwd=REPO, env=self.env if here else
            {k: v for k, v in self.env.items() if k not in CLUSTER_ONLY},
            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs.append(job)
        return job

    def remove(self, keep_logs_in: Path) -> None:
        """Stop the cluster and delete its directory, keeping what its nodes and Ray's own
        processes (GCS, raylets) logged in `keep_logs_in`: a test that failed because a node
        or the GCS went away says why there, under pytest's temporary directories."""
        self.stop()
        try:  # best effort: what cannot be copied (a socket, say) is left out
            shutil.copytree(self.root, keep_logs_in / "cluster-logs", dirs_exist_ok=True,
                            ignore=lambda d, names: [n for n in names if n == "sockets"],
                            symlinks=True)
        except OSError:  # shutil.Error included: every other file is copied before it is raised
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def stop(self) -> None:
        """SIGKILL to each process group started here, then to any process left that carries
        this cluster's tag (Ray's workers run in sessions of their own)."""
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        for pid in _tagged(str(self.root)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# What a run on a local Ray of its own must not see (its processes carry the tag all the same).
CLUSTER_ONLY = ("RAY_ADDRESS", "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S",
                "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")


def _tagged(value: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if f"{TAG}={value}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = Path(tempfile.mkdtemp(prefix="r29-", dir="/tmp"))  # short: Ray's socket paths
    c = Cluster(root)
    try:
        c.add_node()
        yield c
    finally:
        c.remove(tmp_path_factory.mktemp("cluster"))


def wait_for(path: Path, job: subprocess.Popen, timeout_s: float = 900) -> Path:
    """`path`, once the job wrote it; the job ending first fails at once. The time limit only
    stops a job that hangs: on two cores beside two busy loops, step 3 came after 180 s."""
    deadline = time.time() + timeout_s
    while not path.exists():
        if job.poll() is not None:
            pytest.fail(f"the job ended before {path.name} appeared:\n{job.stdout.read()[-3000:]}")
        if time.time() > deadline:
            pytest.fail(f"no {path} after {timeout_s} s")
        time.sleep(0.3)
    return path


def finish(job: subprocess.Popen, timeout_s: float = 900) -> tuple[dict, str]:
    """The job's summary (its last JSON line) and its output."""
    try:
        out, _ = job.communicate(timeout=timeout_s)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    assert job.returncode == 0, out[-4000:]
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1]), out


def weights(run_dir: Path, step: int, out: Path) -> dict:
    dcp_to_torch_save(run_dir / dir_name(step), out)
    return torch.load(out, weights_only=False)


def losses(run_dir: Path) -> dict[int, str]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): r["loss"] for r in csv.DictReader(f) if r["loss"]}


def test_a_run_preempted_twice_saves_resumes_and_ends_as_an_uninterrupted_one(cluster,
                                                                            tmp_path):
    storage = tmp_path / "runs"
    straight = cluster.job(storage, "straight", here=False)  # the reference, at the same time
    job = cluster.job(storage, "spot", "--hold-at-step", "3", "--stall-upload-at-step", "6")
    run = storage / "spot"
    held = wait_for(run / "test-hooks/held-at-step-3", job).read_text().strip()
    # Step 2's asynchronous save is marked complete while training waits at step 3, before the
    # next save begins: a kill now would resume from step 2.
    wait_for(run / dir_name(2) / MARKER, job)
    cluster.add_node()  # the replacement for the node about to go
    cluster.drain(held, NOTICE_S)
    # The second attempt runs on the replacement; its step-6 upload never finishes.
    wait_for(run / "test-hooks/stalled-upload-6", job)
    node = cluster.procs[-1]
    cluster.add_node()
    node.send_signal(signal.SIGTERM)  # what the kubelet sends to PID 1 of an evicted pod
    s, out = finish(job)
    straight, _ = finish(straight)

    # Saved at the step it was held at, and resumed from it; then past the stalled save to the
    # newest complete checkpoint.
    assert "preemption: step 3 saved in" in out, out[-4000:]
    resumed = [int(line.rsplit(" ", 1)[1]) for line in out.splitlines()
               if "resuming from the checkpoint of step" in line]
    assert sorted(set(resumed)) == [3, 4], out[-4000:]  # (Ray repeats some log lines)
    assert not (run / dir_name(6) / MARKER).exists()  # the stalled save, never complete
    assert s["steps"] == 10 and s["resumed_from_step"] == 4, s
    assert s["last_loss"] == straight["last_loss"]
    assert losses(run) == losses(storage / "straight")
    a = weights(storage / "straight", 10, tmp_path / "a.pt")
    b = weights(run, 10, tmp_path / "b.pt")
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
