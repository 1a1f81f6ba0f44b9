"""The stack key gpuCapacityType: on-demand (the default) or spot, anything else refused."""

from __future__ import annotations

import pytest

from stack.config import ConfigError, parse


def test_on_demand_is_the_default_and_spot_is_taken():
    assert parse({}, "us-west-2").gpu_capacity_type == "on-demand"
    assert parse({"gpuCapacityType": "spot"}, "us-west-2").spot


def test_a_typo_is_refused_with_the_known_values():
    with pytest.raises(ConfigError) as e:
        parse({"gpuCapacityType": "spto"}, "us-west-2")
    assert ("gpuCapacityType: unknown 'spto'; did you mean spot?; use one of on-demand, spot"
            in str(e.value))


@pytest.mark.parametrize("key", ["capacityReservation", "capacityBlock"])
def test_spot_cannot_launch_into_a_reservation(key):
    with pytest.raises(ConfigError, match=f"gpuCapacityType: spot nodes cannot launch into the "
                                          f"{key}"):
        parse({"gpuCapacityType": "spot", key: '{"id": "cr-0123456789abcdef0", '
               '"instanceCount": 2}', "gpuAvailabilityZone": "us-west-2b",
               "gpuInstanceType": "p5.48xlarge"}, "us-west-2")
