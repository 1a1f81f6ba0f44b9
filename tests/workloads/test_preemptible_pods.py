"""GPU worker pods that a spot reclaim (or any eviction) can take away without losing the step:
SIGTERM drains the Ray node for longer than the job needs to move its deadline and save, the
pod's grace period outlasts that drain within EC2's two-minute notice, and nothing runs before
SIGTERM that would stop Ray first. The head stays on the on-demand system nodes."""

from __future__ import annotations

import pytest

from tests.workloads.test_manifests import env, stack
from training.pod_contract import RESTART_MARGIN_S
from training.head.scaleup import CAPACITY_TYPE_ENV, QUOTA_ENV
from workloads.raycluster import build_cluster_spec
from workloads.scaleup_watch import watch_container

SPOT_NOTICE_S = 120  # EC2's interruption notice, which EKS drains the node on


@pytest.mark.parametrize("capacity", ["on-demand", "spot"])
def test_a_gpu_pod_drains_longer_than_the_job_needs_and_goes_within_the_notice(capacity):
    spec = build_cluster_spec(stack(gpuCapacityType=capacity))
    pod = spec["workerGroupSpecs"][0]["template"]["spec"]
    (worker,) = pod["containers"]
    drain = int(env(worker)["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"])
    assert drain > RESTART_MARGIN_S + 30  # the margin, the notice, then the save
    assert drain < pod["terminationGracePeriodSeconds"] < SPOT_NOTICE_S
    assert "lifecycle" not in worker  # a preStop runs before SIGTERM: no `ray stop` first
    head = spec["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"role": "system"}
    assert "terminationGracePeriodSeconds" not in head


def test_the_watch_names_the_spot_quota_and_capacity_type():
    spot = {e["name"]: e.get("value") for e in watch_container(
        stack(gpuCapacityType="spot"), "job")["env"]}
    assert spot[CAPACITY_TYPE_ENV] == "spot"
    assert spot[QUOTA_ENV] == "All G and VT Spot Instance Requests, L-3819A6DF"
    on_demand = {e["name"]: e.get("value") for e in watch_container(stack(), "job")["env"]}
    assert on_demand[QUOTA_ENV] == "Running On-Demand G and VT instances, L-DB2E81BA"
