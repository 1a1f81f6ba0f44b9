"""Zone choice from what DescribeAvailabilityZones and the instance-type offerings answer."""

from __future__ import annotations

import pytest

from infra.zones import NetworkError, choose_zones, keep_zones

USE1 = {"us-east-1a": "use1-az6", "us-east-1b": "use1-az3", "us-east-1c": "use1-az1"}


def zones(configured=None, gpu=("us-east-1b", "us-east-1c"), system=tuple(USE1)):
    return choose_zones(configured, USE1, list(gpu), list(system), "g6.12xlarge", "m7i.xlarge")


def test_refused_zone_id_is_skipped_for_both_zones():
    assert zones() == ["us-east-1c", "us-east-1a"]  # us-east-1b is use1-az3


def test_second_zone_must_offer_the_system_type():
    with pytest.raises(NetworkError, match="^systemInstanceType: .* none besides us-east-1c offers"):
        zones(system=("us-east-1b", "us-east-1c"))


def test_gpu_zone_must_offer_the_system_type_too():
    """The system node group spans both zones: a GPU zone without the system type would fail at
    node-group creation, after the cluster is built."""
    four = {**USE1, "us-east-1d": "use1-az2"}
    # us-east-1a offers the GPU type first but not the system type: us-east-1c is the GPU zone.
    assert choose_zones(None, four, ["us-east-1a", "us-east-1c"], ["us-east-1c", "us-east-1d"],
                        "g6.12xlarge", "m7i.xlarge") == ["us-east-1c", "us-east-1d"]
    with pytest.raises(NetworkError, match="^systemInstanceType: no zone that offers g6.12xlarge "
                                           "also offers m7i.xlarge"):
        zones(gpu=("us-east-1a",), system=("us-east-1c",))
    with pytest.raises(NetworkError, match="^gpuAvailabilityZone: us-east-1c does not offer the "
                                           "system node type m7i.xlarge"):
        zones("us-east-1c", system=("us-east-1a",))


@pytest.mark.parametrize("configured, message", [
    ("us-east-1b", "is zone ID use1-az3, where EKS does not accept control-plane subnets"),
    ("us-west-2-lax-1a", "is not an available regular zone"),
    ("us-east-1a", "does not offer g6.12xlarge"),
])
def test_configured_zone_is_checked(configured, message):
    with pytest.raises(NetworkError, match=f"^gpuAvailabilityZone: {configured} {message}"):
        zones(configured)


def test_kept_zones_move_only_with_a_configured_gpu_zone():
    first = ["us-east-1c", "us-east-1a"]
    assert keep_zones(first, ["us-east-1a", "us-east-1c"], None) == first  # AWS's offer changed
    assert keep_zones(first, ["us-east-1c", "us-east-1d"], "us-east-1c") == first
    assert keep_zones(first, ["us-east-1d", "us-east-1a"], "us-east-1d") == ["us-east-1d",
                                                                              "us-east-1a"]
    # Onto the old second zone: the second zone is this run's choice.
    assert keep_zones(first, ["us-east-1a", "us-east-1c"], "us-east-1a") == ["us-east-1a",
                                                                              "us-east-1c"]
