"""gpuCapacityType spot on the AWS side, under mocks: a SPOT GPU group beside the on-demand system
group (where the Ray head runs), the Spot vCPU quota read and enforced as the On-Demand one is,
and the cost outputs labelled an estimate."""

from __future__ import annotations

from unittest import mock

import pytest

from infra.quota import QuotaError
from stack.catalog import PRICES_USD_PER_HOUR
from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.test_program import DEV, NODE_GROUP
from tests.infra.test_quota import G_AND_VT, QUOTA_INVOKE, STANDARD

SPOT_G_AND_VT = "L-3819A6DF"


def deploy(spot_vcpus: float, **overrides) -> tuple[RecordingMocks, Exception | None]:
    """The program with gpuCapacityType spot and this applied Spot quota (G and VT)."""
    mocks = RecordingMocks("us-west-2")
    mocks.quotas[SPOT_G_AND_VT] = ("All G and VT Spot Instance Requests", spot_vcpus)
    # Its usage metric's Class dimension, as Service Quotas lists it for Spot vCPUs.
    with mock.patch("pulumi.log.warn"), \
            mock.patch.dict("tests.infra.mocks.USAGE_CLASS", {SPOT_G_AND_VT: "G/Spot"}):
        try:
            run_program(DEV, {"gpuCapacityType": "spot", **overrides}, mocks=mocks)
        except QuotaError as error:
            return mocks, error
    return mocks, None


@pytest.fixture(scope="module")
def spot():
    mocks, error = deploy(3072.0)
    assert error is None
    return mocks


def test_the_gpu_group_is_spot_and_the_system_group_on_demand(spot):
    assert spot.one(NODE_GROUP, "eks-gpu").inputs["capacityType"] == "SPOT"
    assert spot.one(NODE_GROUP, "eks-system").inputs.get("capacityType", "ON_DEMAND") == \
        "ON_DEMAND"


def test_the_default_gpu_group_is_on_demand():
    mocks = run_program(DEV)
    assert mocks.one(NODE_GROUP, "eks-gpu").inputs["capacityType"] == "ON_DEMAND"


def test_spot_reads_the_spot_quota_instead_of_the_on_demand_one(spot):
    asked = sorted(args["quotaCode"] for token, args in spot.calls if token == QUOTA_INVOKE)
    assert asked == sorted([SPOT_G_AND_VT, STANDARD]) and G_AND_VT not in asked


def test_too_little_spot_quota_fails_before_any_resource_naming_it():
    mocks, error = deploy(48.0)
    assert error is not None and mocks.resources == []
    assert "All G and VT Spot Instance Requests (ec2 L-3819A6DF)" in str(error)
    # 2 nodes + an update's 2 more + a rebalance replacement's 1, of 48 vCPUs each.
    assert "--quota-code L-3819A6DF --desired-value 240" in str(error)


def test_a_p_family_spot_group_reads_the_p_spot_quota():
    """p5.48xlarge on spot counts against "All P Spot Instance Requests" (L-7212CCBC), as a G
    type counts against the G and VT one; too little of it fails before any resource."""
    mocks = RecordingMocks("us-west-2")
    mocks.quotas["L-7212CCBC"] = ("All P Spot Instance Requests", 192.0)
    with mock.patch("pulumi.log.warn"), pytest.raises(QuotaError) as error:
        run_program(DEV, {"gpuCapacityType": "spot", "gpuInstanceType": "p5.48xlarge"},
                    mocks=mocks)
    assert mocks.resources == [] and "All P Spot Instance Requests (ec2 L-7212CCBC)" in \
        str(error.value)
    asked = {args["quotaCode"] for token, args in mocks.calls if token == QUOTA_INVOKE}
    assert "L-7212CCBC" in asked and "L-417A185B" not in asked


def test_the_spot_cost_is_labelled_an_estimate_at_its_ceiling(spot):
    on_demand = run_program(DEV).exports
    assert spot.exports["costIsEstimate"] is True and on_demand["costIsEstimate"] is False
    assert "spot GPU nodes at their ceiling" in spot.exports["costSource"]
    assert "describe-spot-price-history --instance-types g6.12xlarge" in \
        spot.exports["costSource"]
    assert spot.exports["hourlyCostBreakdown"]["gpuNodesDuringRun"] == pytest.approx(
        2 * PRICES_USD_PER_HOUR["us-west-2"]["g6.12xlarge"])


def _seconds(duration: str) -> int:
    """A Go duration as cluster-autoscaler's flags take it ("2m", "90s")."""
    return int(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


def test_a_replacement_node_outlasts_the_reclaimed_workers_termination(spot):
    """KubeRay re-creates the worker only once the terminating pod is gone (its grace period
    after the notice); the replacement node must not be removed as unneeded before the new
    worker lands on it: scale-down-unneeded-time holds twice that wait. On-demand keeps 2m."""
    from program import KUBERAY_RECREATE_S
    from workloads.raycluster import GRACE_S

    def unneeded(mocks: RecordingMocks) -> int:
        release = next(r for r in mocks.of_type("kubernetes:helm.sh/v3:Release")
                       if r.inputs["chart"] == "cluster-autoscaler")
        return _seconds(release.inputs["values"]["extraArgs"]["scale-down-unneeded-time"])

    worker = spot.one("kubernetes:ray.io/v1:RayJob").inputs["spec"]["rayClusterSpec"][
        "workerGroupSpecs"][0]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] == GRACE_S
    assert unneeded(spot) >= 2 * (GRACE_S + KUBERAY_RECREATE_S)
    assert unneeded(run_program(DEV)) == 120
