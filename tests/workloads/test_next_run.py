"""The next queued run starts when Kueue admits it: Kueue frees the finished run's quota when its
RayJob finishes (Workload Finished), and KubeRay 1.7.0 deletes the finished cluster at
status.endTime + ttlSecondsAfterFinished (rayjob_controller.go). A run's system pods fit once on
the system node beside the add-ons, not twice, so the next head schedules at its admission only
if the finished cluster goes at once."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.stack.stacks import STACK_FILES, stack_name
from tests.workloads.test_kueue import _quantity
from tests.workloads.test_manifests import S3, stack
from workloads import helm_values
from workloads.code_bundle import bundle
from workloads.rayjob import LOGS_GRACE_S, build_rayjob


def system_requests(job: dict) -> tuple[float, float]:
    """(vCPU, GiB) the run's pods on the system node request: head (with the scale-up watch) and
    submitter; the workers are on GPU nodes."""
    spec = job["spec"]
    pods = [spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"],
            spec["submitterPodTemplate"]["spec"]]
    reqs = [c["resources"]["requests"] for p in pods for c in p["containers"]]
    return (sum(_quantity(r["cpu"]) for r in reqs),
            sum(_quantity(r["memory"]) for r in reqs) / 2**30)


def addons_requests() -> tuple[float, float]:
    """The add-ons this stack runs on the system node (their chart values)."""
    values = [helm_values.kuberay_operator({})["resources"]["requests"],
              helm_values.kueue({}, "ray")["controllerManager"]["manager"]["resources"][
                  "requests"],
              helm_values.cluster_autoscaler("c", "us-west-2", "v1")["resources"]["requests"]]
    return (sum(_quantity(r["cpu"]) for r in values),
            sum(_quantity(r["memory"]) for r in values) / 2**30)


def fits(cfg, runs: int, job: dict) -> bool:
    """Against the node's whole capacity: an upper bound of what the kubelet allocates."""
    cpu, gib = system_requests(job)
    add_cpu, add_gib = addons_requests()
    return (add_cpu + runs * cpu <= cfg.system.vcpus * cfg.system_node_count
            and add_gib + runs * gib <= cfg.system.memory_gib * cfg.system_node_count)


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
def test_the_next_head_schedules_when_its_run_is_admitted(path):
    cfg = stack(path)
    job = build_rayjob(cfg, bundle(REPO), S3)
    assert fits(cfg, 1, job) and not fits(cfg, 2, job)  # one run's system pods at a time
    ended = 1_000.0  # the previous run's endTime: Kueue admits the next run now
    gone = ended + job["spec"]["ttlSecondsAfterFinished"]  # KubeRay deletes its cluster
    assert max(ended, gone) == ended  # the next head's room is there at its admission
    # What the grace a run without the queue keeps would cost the next queued head.
    assert LOGS_GRACE_S == 300


def test_without_the_queue_the_finished_cluster_stays_for_its_logs():
    job = build_rayjob(stack(queue="false"), bundle(REPO), S3)
    assert job["spec"]["ttlSecondsAfterFinished"] == LOGS_GRACE_S
