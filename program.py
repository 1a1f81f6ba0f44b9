"""The whole stack, in dependency order: config, network, cluster, storage, add-ons, Ray."""

from __future__ import annotations

from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from stack import pulumi_config
from infra import existing
from infra.cluster import Cluster
from infra.cost import hourly_cost
from infra.network import Network, lookup_zones
from infra.storage import CheckpointStorage
from workloads.addons import Addons
from workloads.code_bundle import bundle
from stack.kube import NAMESPACE, SERVICE_ACCOUNT
from workloads.ray import RayWorkloads

REPO = Path(__file__).resolve().parent


def run() -> None:
    # Everything that can be wrong with the inputs fails here, before any resource exists.
    cfg = pulumi_config.load()
    code = bundle(REPO)
    hf_token = pulumi_config.hf_token()

    if cfg.existing_cluster_name:
        cluster_name, kubeconfig = existing.lookup(cfg.existing_cluster_name, cfg.region)
        node_groups: list[pulumi.Resource] = []
        gpu_zone, node_group_names = None, {}
    else:
        network = Network("net", cfg, lookup_zones(cfg))
        cluster = Cluster("eks", cfg, network)
        cluster_name, kubeconfig = cluster.cluster_name, cluster.kubeconfig
        node_groups = [cluster.system_nodes, cluster.gpu_nodes]
        gpu_zone = network.gpu_zone
        node_group_names = {"system": f"{cfg.name}-system", "gpu": f"{cfg.name}-gpu"}

    provider = k8s.Provider("k8s", kubeconfig=kubeconfig, enable_server_side_apply=True)
    storage = CheckpointStorage("ckpt", cfg, cluster_name, NAMESPACE, SERVICE_ACCOUNT)
    addons = Addons("addons", provider, depends_on=node_groups)
    ray = RayWorkloads("ray", cfg, code, storage.uri, hf_token, provider, addons.kuberay,
                       opts=pulumi.ResourceOptions(depends_on=[storage]))

    cost = hourly_cost(cfg)
    pulumi.export("clusterName", cluster_name)
    pulumi.export("kubeconfig", kubeconfig)
    pulumi.export("region", cfg.region)
    pulumi.export("gpuAvailabilityZone", gpu_zone)
    pulumi.export("nodeGroups", node_group_names)
    pulumi.export("hourlyCostUsd", cost["hourlyCostUsd"])
    pulumi.export("hourlyCostBreakdown", cost["breakdown"])
    pulumi.export("checkpointStorage", storage.uri)
    pulumi.export("rayCluster", cfg.name)
    pulumi.export("rayJob", ray.rayjob_name)
