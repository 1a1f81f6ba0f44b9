"""The node groups as data: each spec of infra/node_groups.py becomes a role, a launch template
and a node group, and counts in the quota check, the cost outputs and the nodeGroups output."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest

from infra import node_groups as specs
from infra.quota import quota_needs
from stack.catalog import INSTANCES, PRICES_USD_PER_HOUR
from stack.parse import parse
from tests.infra.harness import run_program
from tests.infra.test_program import DEV, LT, NODE_GROUP

PRICE = PRICES_USD_PER_HOUR["us-west-2"]


def with_data_group(cfg):
    """The stack's groups plus a fixed two-node CPU group in both zones, as a new entry would
    add one."""
    system, gpu = specs.node_groups(cfg)
    data = dataclasses.replace(system, key="data", count_key="dataNodeCount",
                               instance_type="m7i.2xlarge", facts=INSTANCES["m7i.2xlarge"],
                               nodes=2, labels={"role": "data"})
    return system, gpu, data


@pytest.fixture(scope="module")
def three_groups():
    with mock.patch("infra.cluster.node_groups", with_data_group), \
            mock.patch("infra.cost.node_groups", with_data_group), \
            mock.patch("infra.quota.node_groups", with_data_group):
        yield run_program(DEV)


def test_a_new_group_is_one_entry(three_groups):
    m = three_groups
    data = m.one(NODE_GROUP, "eks-data").inputs
    assert data["nodeGroupName"] == "ray-train-dev-data" and data["labels"] == {"role": "data"}
    assert data["scalingConfig"] == {"desiredSize": 2, "minSize": 2, "maxSize": 2}
    assert data["subnetIds"] == ["net-private-0-id", "net-private-1-id"]
    assert data["launchTemplate"]["id"] == "eks-data-lt-id"
    assert m.one(LT, "data-lt").inputs["metadataOptions"]["httpPutResponseHopLimit"] == 1
    assert m.depends_on("eks-data", "eks-data-node-AmazonEKSWorkerNodePolicy")
    assert m.exports["nodeGroups"]["data"] == "ray-train-dev-data"
    assert m.exports["hourlyCostBreakdown"]["dataNodes"] == pytest.approx(2 * PRICE["m7i.2xlarge"])
    assert m.depends_on("addons-kuberay-operator", "eks-data")  # add-ons wait for every group
    assert m.depends_on("eks-coredns", "eks-data")  # untainted: CoreDNS may run there


def test_a_new_group_counts_in_the_quota_check():
    cfg = parse({}, "us-west-2")
    with mock.patch("infra.quota.node_groups", with_data_group):
        (standard,) = [n for n in quota_needs(cfg) if n.quota.code == "L-1216C47A"]
    # 1 x 4 vCPUs of m7i.xlarge and 2 x 8 of m7i.2xlarge; 2 surge nodes per zone of each.
    assert (standard.nodes, standard.surge) == (4 + 16, 2 * 2 * 4 + 2 * 2 * 8)
    assert standard.what == "systemNodeCount 1 x m7i.xlarge and dataNodeCount 2 x m7i.2xlarge"
