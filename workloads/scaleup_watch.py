"""The run's head pod, extended for the cold start: what the job needs to report where its first
minutes went (the RayJob's name, the GPU node's price), and a second container that watches why
the GPU workers are not coming and ends a run that cannot start (training/head/scaleup.py).

A container of the head pod because nothing else of the run exists while its GPU nodes are
missing: KubeRay creates the submitter only once every pod runs. It stays running afterwards (a
pod is Ready only while all its containers are). It runs the shipped training code from the code
ConfigMap, in the Ray image the system node has already pulled for the head.
"""

from __future__ import annotations

import copy

from stack.catalog import region_prices
from stack.config import StackConfig
from stack.kube import CODE_MOUNT
from training.head.cold_start import CLUSTER_ENV, NAMESPACE_ENV, PRICE_ENV, RAYJOB_ENV
from training.head.scaleup import CAPACITY_TYPE_ENV, QUOTA_ENV
from workloads.code_bundle import CodeBundle

WATCH_CONTAINER = "scaleup-watch"
WATCH_RESOURCES = {"cpu": "100m", "memory": "256Mi"}  # python + PyYAML, a poll each 15 s


def gpu_node_price(cfg: StackConfig) -> float:
    """The GPU instance's on-demand USD per hour in the stack's Region, or in the estimate Region
    where the table has none (stack.catalog.region_prices, as the cost outputs)."""
    return region_prices(cfg.region)[0][cfg.gpu_instance_type]


def cold_start_env(cfg: StackConfig, rayjob_name: str) -> list[dict]:
    """The run's RayJob and GPU price, and how its GPU nodes are bought (the scale-up fixes):
    the stack's capacity record, its name and the vCPU quota its launches count against, as the
    node group and the quota check read it (none for a family or capacity without one)."""
    quota = cfg.gpu_capacity.vcpu_quota(cfg.gpu_instance_type)
    market = [{"name": QUOTA_ENV, "value": f"{quota.name}, {quota.code}"}] if quota else []
    return [{"name": RAYJOB_ENV, "value": rayjob_name},
            {"name": PRICE_ENV, "value": str(gpu_node_price(cfg))},
            {"name": CAPACITY_TYPE_ENV, "value": cfg.gpu_capacity.name}, *market]


def watch_container(cfg: StackConfig, rayjob_name: str) -> dict:
    end = "--end-on-scaleup-failure" if cfg.end_on_scale_up_failure \
        else "--no-end-on-scaleup-failure"
    # KubeRay sets the cluster's name and namespace only in the Ray container: the same values
    # from the pod's own label and namespace (downward API).
    identity = [{"name": CLUSTER_ENV, "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.labels['ray.io/cluster']"}}},
                {"name": NAMESPACE_ENV, "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.namespace"}}}]
    return {
        "name": WATCH_CONTAINER,
        "image": cfg.image,
        "command": ["python", "-m", "training.head.scaleup", "--stay", end],
        "workingDir": CODE_MOUNT,
        "env": [*identity, *cold_start_env(cfg, rayjob_name)],
        "resources": {"requests": dict(WATCH_RESOURCES), "limits": dict(WATCH_RESOURCES)},
        "volumeMounts": [{"name": "code", "mountPath": CODE_MOUNT, "readOnly": True}],
    }


def with_cold_start(cluster_spec: dict, cfg: StackConfig, bundle: CodeBundle,
                    rayjob_name: str) -> dict:
    """A copy of the run's cluster spec whose head knows its RayJob and price and runs the
    scale-up watch."""
    spec = copy.deepcopy(cluster_spec)
    pod = spec["headGroupSpec"]["template"]["spec"]
    pod["containers"][0]["env"] += cold_start_env(cfg, rayjob_name)  # the Ray container (first)
    pod["containers"].append(watch_container(cfg, rayjob_name))
    pod["volumes"].append(bundle.volume(rayjob_name))
    return spec
