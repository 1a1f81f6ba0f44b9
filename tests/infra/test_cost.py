"""The hourly cost outputs from the one price table: idle, and while a run holds its GPU nodes."""

from __future__ import annotations

import dataclasses
from datetime import date

import pytest

from infra.cost import hourly_cost
from stack.catalog import PRICES_USD_PER_HOUR
from stack.parse import parse


def test_cost_idle_and_during_a_run():
    before_extended = date(2026, 11, 30)
    cost = hourly_cost(parse({}, "us-west-2"), before_extended)
    # The reference quotes ~9.50 USD/h for 2x g6.12xlarge + system node + EKS + NAT.
    assert 9.0 < cost.run < 10.0
    assert cost.run == pytest.approx(sum(cost.breakdown.values()))
    during_run = sum(v for k, v in cost.breakdown.items() if k.endswith("DuringRun"))
    assert cost.idle == pytest.approx(cost.run - during_run)
    assert cost.idle < 0.5  # control plane, NAT gateway and one m7i.xlarge
    none = hourly_cost(parse({"gpuNodeCount": "0"}, "us-west-2"), before_extended)
    assert none.run == none.idle


def test_cost_counts_the_nat_address_and_the_root_volumes():
    """The NAT gateway's public IPv4 (0.005 USD/h), the system nodes' 100 GiB gp3 root volumes
    (always) and the GPU nodes' rootVolumeGib (during a run), at 0.08 USD per GB-month."""
    cfg = parse({"systemNodeCount": "2", "gpuNodeCount": "3", "rootVolumeGib": "400"}, "us-west-2")
    breakdown = hourly_cost(cfg, date(2026, 11, 30)).breakdown
    assert breakdown["natPublicIpv4"] == 0.005
    assert breakdown["systemRootVolumes"] == pytest.approx(2 * 100 * 0.08 / 720, abs=1e-4)
    assert breakdown["gpuRootVolumesDuringRun"] == pytest.approx(3 * 400 * 0.08 / 720, abs=1e-4)
    existing = hourly_cost(parse({"existingClusterName": "shared"}, "us-west-2"), date(2026, 11, 30))
    assert existing.breakdown["natPublicIpv4"] == existing.breakdown["systemRootVolumes"] == 0


@pytest.mark.parametrize("version, today, price", [
    ("1.34", date(2026, 12, 2), 0.10),  # last day of standard support
    ("1.34", date(2026, 12, 3), 0.60),  # extended support from then on
    ("1.35", date(2026, 12, 3), 0.10),
])
def test_control_plane_price_follows_the_version_support(version, today, price):
    cost = hourly_cost(parse({"kubernetesVersion": version}, "us-west-2"), today)
    assert cost.breakdown["eksControlPlane"] == price


def test_cost_outside_the_price_table_is_labelled_an_estimate():
    """Only Regions whose prices were read are in stack/catalog.py; elsewhere the outputs say
    the figures are us-east-1's."""
    today = date(2026, 11, 30)
    for region in ("us-east-1", "us-west-2"):
        cost = hourly_cost(parse({}, region), today)
        assert cost.is_estimate is False and cost.source.endswith(region)
    frankfurt = hourly_cost(parse({}, "eu-central-1"), today)
    assert frankfurt.is_estimate is True
    assert frankfurt.source.startswith("estimate: us-east-1 prices")
    assert "no prices for eu-central-1" in frankfurt.source


def test_fixed_groups_are_idle_cost_and_autoscaled_ones_cost_during_a_run():
    cfg = parse({"systemNodeCount": "2", "gpuNodeCount": "3"}, "us-west-2")
    breakdown = hourly_cost(cfg, date(2026, 11, 30)).breakdown
    assert breakdown["systemNodes"] == pytest.approx(2 * PRICES_USD_PER_HOUR["us-west-2"]["m7i.xlarge"])
    assert breakdown["gpuNodesDuringRun"] == pytest.approx(3 * PRICES_USD_PER_HOUR["us-west-2"]["g6.12xlarge"])
    # On an existing cluster the system nodes are not this stack's; a run's GPU nodes are.
    shared = hourly_cost(dataclasses.replace(cfg, existing_cluster_name="shared"),
                         date(2026, 11, 30)).breakdown
    assert shared["systemNodes"] == 0 and shared["gpuNodesDuringRun"] == breakdown[
        "gpuNodesDuringRun"]
