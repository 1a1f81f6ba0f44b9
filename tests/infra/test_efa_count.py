"""One EFA count per GPU type: what the launch template attaches, what the autoscaler's node
template promises and what the worker pod requests must agree, or the pod never schedules
(fewer devices than requested) and the autoscaler keeps adding nodes that cannot hold it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infra.node_groups import (EFA_RESOURCE, NODE_TEMPLATE_RESOURCE_TAG, launch_template_args,
                               node_groups)
from stack import catalog
from stack.parse import parse
from tests.stack.stacks import STACK_FILES, raw_config, stack_name
from workloads.raycluster import build_cluster_spec

EFA_TYPES = [t for t, facts in catalog.INSTANCES.items() if facts.efa_interfaces]


@pytest.fixture(scope="module")
def dev():
    raw, region = raw_config(next(p for p in STACK_FILES if stack_name(p) == "dev"))
    return parse(raw, region)


def test_the_catalog_has_a_multi_card_efa_type():
    assert any(catalog.INSTANCES[t].efa_interfaces > 1 for t in EFA_TYPES)  # p5.48xlarge: 32


@pytest.mark.parametrize("gpu_type", EFA_TYPES)
def test_launch_template_tag_and_pod_request_agree_on_the_efa_count(dev, gpu_type):
    cfg = replace(dev, gpu_instance_type=gpu_type)
    (gpu,) = [g for g in node_groups(cfg) if g.efa]
    interfaces = launch_template_args(gpu, {}, None, "sg-1")["network_interfaces"]
    efa = [n for n in interfaces if n["interface_type"] == "efa"]
    tag = int(gpu.autoscaler_tags()[NODE_TEMPLATE_RESOURCE_TAG + EFA_RESOURCE])
    (worker,) = build_cluster_spec(cfg)["workerGroupSpecs"]
    (container,) = worker["template"]["spec"]["containers"]
    request = int(container["resources"]["requests"][EFA_RESOURCE])
    assert len(efa) == tag == request == catalog.INSTANCES[gpu_type].efa_interfaces
    # One interface per network card; the primary at device index 0, the others at 1.
    assert [n["network_card_index"] for n in interfaces] == list(range(len(interfaces)))
    assert [n["device_index"] for n in interfaces] == [0] + [1] * (len(interfaces) - 1)
    assert all(n["security_groups"] == ["sg-1"] for n in interfaces)
