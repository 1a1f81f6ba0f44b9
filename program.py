"""The whole stack, in dependency order: config, network, cluster, storage, add-ons, Ray."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from infra import existing
from infra.autoscaler import AutoscalerIdentity
from infra.cluster import Cluster
from infra.cost import hourly_cost
from infra.image_cache import ImageCache
from infra.lookups import require_aws_partition
from infra.network import Network, lookup_zones
from infra.quota import check_quotas
from infra.storage import CheckpointStorage
from stack import pulumi_config
from stack.catalog import CHARTS, KUBERNETES_RELEASES
from stack.kube import SERVICE_ACCOUNT
from workloads import helm_values
from workloads.addons import Addons
from workloads.code_bundle import bundle
from workloads.crds import kuberay_crds
from workloads.ray import RayWorkloads

REPO = Path(__file__).resolve().parent


def run() -> None:
    # Everything that can be wrong with the inputs fails here, before any resource exists.
    cfg = pulumi_config.load()
    require_aws_partition(cfg.region)
    code = bundle(REPO)
    hf_token = pulumi_config.hf_token()
    # None: the existing cluster's own KubeRay serves the RayJob (no second operator).
    crds = None if cfg.existing_kuberay else kuberay_crds(CHARTS["kuberay-operator"].version)
    profile = pulumi.Config("aws").get("profile")  # the Kubernetes provider authenticates with it

    crd_provider = None
    if cfg.existing_cluster_name:
        cluster_name, kubeconfig, user_kubeconfig = existing.lookup(cfg, profile)
        addon_deps: list[pulumi.Resource] = []
        gpu_zone, node_group_names, autoscaler_values = None, {}, None
        image_cache = None
        if crds is not None:
            # KubeRay's CRDs may be there already (Helm never deletes crds/; kubectl apply):
            # pulumi-kubernetes >= 4.29 creates with a plain POST and fails on AlreadyExists
            # unless told to upsert (CHANGELOG 4.29.0), and its upsert is a server-side apply
            # that forces field conflicts with their other managers only with patch force
            # (provider/pkg/await/await.go Creation, patchForce). Only the CRDs: anything else
            # of that name on a shared cluster is not ours to take over.
            crd_provider = k8s.Provider("k8s-crds", kubeconfig=kubeconfig,
                                        enable_server_side_apply=True,
                                        upsert_existing_objects=True, enable_patch_force=True)
    else:
        check_quotas(cfg)  # before any resource: a run that cannot launch its nodes bills anyway
        network = Network("net", cfg, lookup_zones(cfg))
        cluster = Cluster("eks", cfg, network, profile)
        cluster_name, kubeconfig = cluster.cluster_name, cluster.kubeconfig
        user_kubeconfig = cluster.user_kubeconfig
        autoscaler = AutoscalerIdentity("autoscaler", cfg, cluster_name)
        addon_deps = [cluster.system_nodes, cluster.gpu_nodes, autoscaler.association]
        gpu_zone = network.gpu_zone
        node_group_names = {"system": cluster.system_group, "gpu": cluster.gpu_group}
        autoscaler_values = helm_values.cluster_autoscaler(
            cluster_name, cfg.region, KUBERNETES_RELEASES[cfg.kubernetes_version].cluster_autoscaler)
        image_cache = (ImageCache("images", cfg, [cluster.system_role, cluster.gpu_role]).repository
                       if cfg.caches_images else None)

    provider = k8s.Provider("k8s", kubeconfig=kubeconfig, enable_server_side_apply=True)
    storage = CheckpointStorage("ckpt", cfg, cluster_name, cfg.namespace, SERVICE_ACCOUNT)
    addons = Addons("addons", provider, depends_on=addon_deps,
                    system_node_selector=dict(cfg.system_node_selector), region=cfg.region,
                    kuberay_crds=crds, autoscaler_values=autoscaler_values,
                    crd_provider=crd_provider)
    ray = RayWorkloads("ray", cfg, code, storage.uri, hf_token, provider, addons.kuberay,
                       storage.association, image_cache=image_cache)

    cost = hourly_cost(cfg, date.today())
    pulumi.export("clusterName", cluster_name)
    pulumi.export("kubeconfig", user_kubeconfig)
    pulumi.export("region", cfg.region)
    pulumi.export("gpuAvailabilityZone", gpu_zone)
    pulumi.export("nodeGroups", node_group_names)
    pulumi.export("idleCostUsdPerHour", cost["idleUsdPerHour"])  # no job: no GPU node
    pulumi.export("runCostUsdPerHour", cost["runUsdPerHour"])  # while a run holds its GPU nodes
    pulumi.export("hourlyCostBreakdown", cost["breakdown"])
    pulumi.export("costIsEstimate", cost["isEstimate"])  # no prices of this Region in the table
    pulumi.export("costSource", cost["source"])
    pulumi.export("checkpointStorage", storage.uri)
    pulumi.export("rayNamespace", cfg.namespace)
    pulumi.export("rayJob", ray.rayjob_name)
    pulumi.export("rayHeadService", ray.head_service)
