"""The job gets its instance type's EFA floor and the stack's strictEfa as flags, only where its
traffic crosses nodes (one node: no EFA link to check)."""

from __future__ import annotations

import shlex

from stack.catalog import INSTANCES
from tests.workloads.test_manifests import S3, stack
from workloads.rayjob import entrypoint_args


def _flags(**overrides) -> list[str]:
    return shlex.split(shlex.join(entrypoint_args(stack(**overrides), S3)))


def test_a_multi_node_run_gets_the_floor_of_its_instance_type_and_strict_efa():
    floor = INSTANCES[stack().gpu_instance_type].efa_floor_gbps
    args = _flags(strictEfa="true")
    assert args[args.index("--efa-floor-gbps") + 1] == str(floor)
    assert "--strict-efa" in args
    assert "--strict-efa" not in _flags(strictEfa="false")


def test_a_one_node_run_has_no_floor():
    assert "--efa-floor-gbps" not in _flags(gpuNodeCount="1")


def test_a_worker_knows_its_kubernetes_node_from_the_downward_api():
    from workloads.raycluster import build_cluster_spec

    worker = build_cluster_spec(stack())["workerGroupSpecs"][0]["template"]["spec"]
    env = {e["name"]: e for e in worker["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
