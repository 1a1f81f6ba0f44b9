"""Zone choice from what DescribeAvailabilityZones and the instance-type offerings answer."""

from __future__ import annotations

import pytest

from infra.zones import NetworkError, choose_zones

USE1 = {"us-east-1a": "use1-az6", "us-east-1b": "use1-az3", "us-east-1c": "use1-az1"}


def zones(configured=None, gpu=("us-east-1b", "us-east-1c"), system=tuple(USE1)):
    return choose_zones(configured, USE1, list(gpu), list(system), "g6.12xlarge", "m7i.xlarge")


def test_refused_zone_id_is_skipped_for_both_zones():
    assert zones() == ["us-east-1c", "us-east-1a"]  # us-east-1b is use1-az3


def test_second_zone_must_offer_the_system_type():
    with pytest.raises(NetworkError, match="^systemInstanceType: .* none besides us-east-1c offers"):
        zones(system=("us-east-1b", "us-east-1c"))


@pytest.mark.parametrize("configured, message", [
    ("us-east-1b", "is zone ID use1-az3, where EKS does not accept control-plane subnets"),
    ("us-west-2-lax-1a", "is not an available regular zone"),
    ("us-east-1a", "does not offer g6.12xlarge"),
])
def test_configured_zone_is_checked(configured, message):
    with pytest.raises(NetworkError, match=f"^gpuAvailabilityZone: {configured} {message}"):
        zones(configured)
