"""The On-Demand vCPU quota check at `pulumi up`, under mocks that answer like Service Quotas."""

from __future__ import annotations

from unittest import mock

import pytest

from infra.quota import QuotaError, quota_needs
from stack import catalog
from stack.parse import parse
from tests.infra.harness import run_program
from tests.infra.mocks import RecordingMocks
from tests.infra.test_program import DEV
from tests.stack.stacks import raw_config

QUOTA_INVOKE = "aws:servicequotas/getServiceQuota:getServiceQuota"
G_AND_VT, STANDARD = "L-DB2E81BA", "L-1216C47A"


def deploy(quotas: dict[str, float] | None = None, denied: bool = False, **overrides):
    """Run the program with these applied quota values; (mocks, warnings, error or None)."""
    mocks = RecordingMocks("us-west-2")
    for code, value in (quotas or {}).items():
        mocks.quotas[code] = (mocks.quotas[code][0], value)
    mocks.quota_denied = denied
    warnings: list[str] = []
    with mock.patch("pulumi.log.warn", side_effect=lambda msg, *a, **k: warnings.append(msg)):
        try:
            run_program(DEV, overrides, mocks=mocks)
        except QuotaError as error:
            return mocks, warnings, error
    return mocks, warnings, None


def asked(mocks: RecordingMocks) -> list[str]:
    return [args["quotaCode"] for token, args in mocks.calls if token == QUOTA_INVOKE]


def test_every_instance_type_in_the_catalog_has_its_on_demand_quota():
    assert {t: catalog.ON_DEMAND.vcpu_quota(t).code for t in catalog.INSTANCES} == {
        "m7i.xlarge": STANDARD, "m7i.2xlarge": STANDARD, "g6.12xlarge": G_AND_VT,
        "g6.48xlarge": G_AND_VT, "g6e.12xlarge": G_AND_VT, "g5.2xlarge": G_AND_VT,
        "p5.48xlarge": "L-417A185B"}
    # Inf has a quota of its own (not Standard's "I"): unknown rather than wrong.
    assert catalog.ON_DEMAND.vcpu_quota("inf2.xlarge") is None


def test_the_need_is_the_nodes_vcpus_and_an_update_surge_per_zone():
    cfg = parse(raw_config(DEV)[0], "us-west-2")
    needs = {n.quota.code: (n.nodes, n.surge) for n in quota_needs(cfg)}
    # 2 x 48 vCPUs, and 2 more nodes in the GPU group's one zone; 1 x 4, up to 2 per zone of 2.
    assert needs == {G_AND_VT: (96, 96), STANDARD: (4, 16)}


def test_enough_quota_deploys_and_reads_each_quota_once():
    mocks, warnings, error = deploy()
    assert error is None and warnings == [] and mocks.of_type("eks:index:Cluster")
    assert sorted(asked(mocks)) == sorted([G_AND_VT, STANDARD])


def test_too_little_quota_fails_before_any_resource_with_the_numbers_and_the_request():
    mocks, _, error = deploy({G_AND_VT: 64.0})
    assert error is not None and mocks.resources == []
    text = str(error)
    assert "gpuNodeCount 2 x g6.12xlarge: 96 vCPUs needed" in text and "is 64 vCPUs" in text
    assert ("aws service-quotas request-service-quota-increase --service-code ec2 --quota-code "
            "L-DB2E81BA --desired-value 192 --region us-west-2") in text
    assert "Standard" not in text  # only the short quota is named


def test_every_short_quota_is_listed_at_once():
    _, _, error = deploy({G_AND_VT: 0.0, STANDARD: 0.0})
    assert "gpuNodeCount" in str(error) and "systemNodeCount" in str(error)


def test_room_for_the_nodes_but_not_an_update_surge_is_a_warning():
    mocks, warnings, error = deploy({G_AND_VT: 96.0})
    assert error is None and mocks.of_type("eks:index:Cluster")
    assert len(warnings) == 1 and "not for the 96 more of a node group update" in warnings[0]


def test_access_denied_to_service_quotas_warns_and_deploys():
    mocks, warnings, error = deploy(denied=True)
    assert error is None and mocks.of_type("eks:index:Cluster")
    assert len(warnings) == 2 and all("access denied" in w for w in warnings)
    assert any("aws service-quotas get-service-quota --service-code ec2 --quota-code L-DB2E81BA"
               in w and "96 vCPUs" in w for w in warnings)


@pytest.mark.parametrize("overrides", [
    {"capacityReservation": '{"id": "cr-0123456789abcdef0", "instanceCount": 2}',
     "gpuAvailabilityZone": "us-west-2b"},
    {"runJob": "false"}], ids=["reservation", "no-run"])
def test_gpu_quota_is_not_read_for_a_reservation_or_without_a_run(overrides):
    """A reservation was checked against the quota when it was made; no run launches no GPU."""
    mocks, _, error = deploy({G_AND_VT: 0.0}, **overrides)
    assert error is None and asked(mocks) == [STANDARD]


def test_an_existing_cluster_reads_no_quota():
    mocks, _, error = deploy({G_AND_VT: 0.0, STANDARD: 0.0}, existingClusterName="shared-gpu")
    assert error is None and asked(mocks) == []
