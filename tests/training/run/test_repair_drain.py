"""An EKS node repair's drain during a run on a real local Ray cluster of several nodes (the
preemption tests' cluster: tests/training/run/test_preemption.py), with the driver's Kubernetes
API on loopback (tests/training/kube_fake.py).

The GPU of the run's node falls off the bus: the monitoring agent sets AcceleratedHardwareReady
False, NvidiaXID79Error (aws/eks-node-monitoring-agent dcgm_policies.go, node_exporter.go);
repair drains the node, which reaches the pod as an eviction's SIGTERM to its `ray start
--block` (what the preemption test's second drain does); then it replaces the node, whose Node
is deleted. The run saves the step it was at, resumes on the new node from it, and its summary
lists the drain as a repair, classified while the Node still said why.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import REPO
from tests.training import kube_fake
from tests.training.run.test_preemption import JOB, Cluster, losses
from workloads.rbac import head_rbac

SICK, SPARE = "ip-10-0-2-20", "ip-10-0-2-21"
# The driver as on the Ray head, with its service account pointing at the fake API server.
DRIVER = ("import pathlib, sys; from training.head import kube_api; "
          "kube_api.SA_DIR = pathlib.Path(sys.argv.pop(1)); "
          "from training.driver.cli import main; sys.exit(main())")


def _driver(c: Cluster, env: dict, sa, storage, name: str, *flags: str) -> subprocess.Popen:
    """The job, its output in <storage>/<name>.log (read whole at the end, even on a timeout)."""
    storage.mkdir(parents=True, exist_ok=True)
    job = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(sa), "--address", c.address, "--storage-path",
         str(storage), "--name", name, *JOB, *flags], cwd=REPO, env={**c.env, **env},
        start_new_session=True, stdout=open(storage / f"{name}.log", "w"),
        stderr=subprocess.STDOUT, text=True)
    c.procs.append(job)
    return job


def _finish(job: subprocess.Popen, log: Path, timeout_s: float = 600) -> tuple[dict, str]:
    """The job's summary (its last JSON line) and its output."""
    try:
        job.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pass
    out = log.read_text()
    assert job.returncode == 0, out[-6000:]
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1]), out


def test_a_repair_drain_resumes_from_the_step_in_progress_and_shows_in_the_summary(tmp_path):
    root = Path(tempfile.mkdtemp(prefix="rd-", dir="/tmp"))  # short: Ray's socket paths
    c = Cluster(root)
    t0 = time.time()
    world = {"nodes": [kube_fake.node(SICK, t0 - 3600, t0 - 3500),
                       kube_fake.node(SPARE, t0, t0)]}
    try:
        with kube_fake.FakeKube(world, head_rbac("ray", "j", True), tls_dir=tmp_path) as kube:
            env, sa = kube_fake.in_cluster_env(kube, tmp_path, "c", None, price=None)
            env = {k: env[k] for k in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
            sick = c.add_node(NODE_NAME=SICK)
            run = tmp_path / "runs" / "repair"
            job = _driver(c, env, sa, tmp_path / "runs", "repair", "--steps", "4",
                          "--checkpoint-every", "4", "--hold-at-step", "2",
                          "--efa-floor-gbps", "1e-6")  # below any link: the check passes
            _wait_for(run / "test-hooks/held-at-step-2", job, 400)  # a busy machine: slow
            # The agent marks the node at the XID; repair drains it 10 minutes later (EKS user
            # guide, nodes/node-repair.adoc), so the condition is there before the drain.
            kube.world["nodes"][0] = kube_fake.xid_node(SICK, time.time())
            c.add_node(NODE_NAME=SPARE)  # the repair's replacement, in the cluster before the drain
            early = sorted(p.name for p in (run / "node-events").glob("*"))
            sick.send_signal(signal.SIGTERM)  # the drain's eviction, at PID 1 of the pod
            _wait_for(run / "node-events", job, 120, "*.reason.json")
            kube.world["nodes"].pop(0)  # replaced: its Node is gone long before the summary
            s, out = _finish(job, tmp_path / "runs/repair.log")
    finally:
        c.remove(tmp_path)
    [event] = s["node_events"]
    assert (event["reason"], event["detail"]) == (
        "repair", "AcceleratedHardwareReady=False (NvidiaXID79Error)"), (
        event, f"node events before the drain: {early}", out[-6000:])
    assert event["kube_nodes"] == [SICK] and event["step_saved"] == 2
    assert t0 < event["time"] <= event["classified_at"] < event["time"] + 30
    # Step 2, the one in progress at the drain, saved (the only checkpoint before step 4) and
    # resumed from: every step once, none lost, none repeated.
    assert "preemption: step 2 saved in" in out, out[-4000:]
    assert s["resumed_from_step"] == 2 and s["steps"] == 4, s
    assert sorted(losses(run)) == [1, 2, 3, 4]
    # The link floor, checked before the first step of each attempt: passed, no warning.
    checked = re.findall(r"link floor: ([\d.]+) GB/s against a floor of 0.00 GB/s, checked in "
                         r"([\d.]+) s", out)
    assert len(checked) >= 2 and "WARNING: the link between" not in out, out


def _wait_for(path: Path, job: subprocess.Popen, timeout_s: float, glob: str = "") -> None:
    """Until `path` exists (with `glob`: holds a file that matches it)."""
    deadline = time.time() + timeout_s
    while not (list(path.glob(glob)) if glob else path.exists()):
        assert job.poll() is None, f"the job ended before {path.name}/{glob} appeared"
        assert time.time() < deadline, f"no {path}/{glob} after {timeout_s} s"
        time.sleep(0.2)
