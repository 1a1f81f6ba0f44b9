"""The whole stack, in dependency order: config, network, cluster, storage, add-ons, Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Mapping

import pulumi
import pulumi_kubernetes as k8s

from infra import existing
from infra.autoscaler import AutoscalerIdentity
from infra.cluster import Cluster, scaling_updates
from infra.cost import hourly_cost
from infra.engine import require_cli
from infra.image_cache import ImageCache
from infra.lookups import require_aws_partition
from infra.network import Network, existing_zones, lookup_zones
from infra.quota import check_quotas
from infra.replacement import refuse_replacement_during_run
from infra.storage import CheckpointStorage
from stack import pulumi_config
from stack.catalog import CHARTS, KUBERNETES_RELEASES, SPOT
from stack.config import StackConfig
from stack.images import through_cache
from stack.kube import SERVICE_ACCOUNT
from workloads import helm_values
from workloads.addons import Addons
from workloads.code_bundle import bundle
from workloads.crds import kuberay_crds
from workloads.raycluster import GRACE_S
from workloads.ray import RayWorkloads

REPO = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Target:
    """The cluster the add-ons and Ray workloads go onto: this stack's own, or an existing one
    (which has no zone, node groups, autoscaler or image cache of this stack's)."""

    cluster_name: pulumi.Input[str]
    kubeconfig: pulumi.Output[str]  # for the Kubernetes provider
    user_kubeconfig: pulumi.Output[str]  # exported, for people
    addon_deps: list[pulumi.Resource] = field(default_factory=list)
    gpu_zone: pulumi.Output[str] | None = None
    node_groups: Mapping[str, str] = field(default_factory=dict)  # spec key -> EKS name
    autoscaler_values: dict | None = None
    image_cache: pulumi.Output[str] | None = None
    crd_provider: k8s.Provider | None = None  # adopts KubeRay CRDs that are already there


def run() -> None:
    # Everything that can be wrong with the inputs fails here, before any resource exists.
    require_cli()
    cfg = pulumi_config.load()
    require_aws_partition(cfg.region)
    code = bundle(REPO)
    hf_token = pulumi_config.secret("hfToken", "hf_...")
    mlflow_password = pulumi_config.secret("mlflowTrackingPassword", "<password>")
    # None: the existing cluster's own KubeRay serves the RayJob (no second operator).
    crds = None if cfg.existing_kuberay else kuberay_crds(CHARTS["kuberay-operator"].version)
    profile = pulumi.Config("aws").get("profile")  # the Kubernetes provider authenticates with it

    target = (existing_cluster(cfg, profile, adopt_crds=crds is not None)
              if cfg.existing_cluster_name else own_cluster(cfg, profile))
    provider = k8s.Provider("k8s", kubeconfig=target.kubeconfig, enable_server_side_apply=True)
    storage = CheckpointStorage("ckpt", cfg, target.cluster_name, cfg.namespace, SERVICE_ACCOUNT)
    addons = Addons("addons", provider, depends_on=target.addon_deps,
                    system_node_selector=dict(cfg.system_node_selector), region=cfg.region,
                    kuberay_crds=crds, autoscaler_values=target.autoscaler_values,
                    crd_provider=target.crd_provider,
                    kueue_namespace=cfg.namespace if cfg.installs_kueue else None,
                    kueue_release=cfg.kueue_release)
    ray = RayWorkloads("ray", cfg, code, storage.uri, hf_token, provider, addons.kuberay,
                       storage.association, image_cache=target.image_cache,
                       mlflow_password=mlflow_password, kueue=addons.kueue)
    export(cfg, target, storage, ray)


def existing_cluster(cfg: StackConfig, profile: str | None, adopt_crds: bool) -> Target:
    """An existing cluster, checked before any resource (infra/existing.py)."""
    cluster_name, kubeconfig, user_kubeconfig = existing.lookup(cfg, profile)
    crd_provider = None
    if adopt_crds:
        # KubeRay's CRDs may be there already (Helm never deletes crds/; kubectl apply):
        # pulumi-kubernetes >= 4.29 creates with a plain POST and fails on AlreadyExists
        # unless told to upsert (CHANGELOG 4.29.0), and its upsert is a server-side apply
        # that forces field conflicts with their other managers only with patch force
        # (provider/pkg/await/await.go Creation, patchForce). Only the CRDs: anything else
        # of that name on a shared cluster is not ours to take over.
        crd_provider = k8s.Provider("k8s-crds", kubeconfig=kubeconfig,
                                    enable_server_side_apply=True,
                                    upsert_existing_objects=True, enable_patch_force=True)
    return Target(cluster_name, kubeconfig, user_kubeconfig, crd_provider=crd_provider)


def own_cluster(cfg: StackConfig, profile: str | None) -> Target:
    """This stack's network, cluster and node groups, the autoscaler's identity and the image
    cache; the add-ons wait for every node group and for the autoscaler's credentials."""
    check_quotas(cfg)  # before any resource: a run that cannot launch its nodes bills anyway
    ignore_changes = scaling_updates(cfg)  # likewise: a new GPU maximum while a run holds nodes
    refuse_replacement_during_run(cfg)  # and a change that would replace a group under a run
    network = Network("net", cfg, lookup_zones(cfg), existing_zones(cfg))
    cluster = Cluster("eks", cfg, network, ignore_changes, profile)
    autoscaler = AutoscalerIdentity("autoscaler", cfg, cluster.cluster_name)
    image_cache = (ImageCache("images", cfg, list(cluster.node_roles.values())).repository
                   if cfg.caches_images else None)
    return Target(
        cluster.cluster_name, cluster.kubeconfig, cluster.user_kubeconfig,
        addon_deps=[*cluster.node_groups.values(), autoscaler.association],
        gpu_zone=network.gpu_zone, node_groups=cluster.node_group_names,
        autoscaler_values=autoscaler_values(cfg, cluster.cluster_name),
        image_cache=image_cache)


# Spot: after a reclaim KubeRay re-creates the worker pod only once the terminating one is gone
# (KubeRay v1.7.0 reconcilePods counts terminating pods), up to the pod's grace period after the
# notice; the replacement node (Capacity Rebalancing launches it early) sits empty meanwhile, and
# cluster-autoscaler removes an empty node after scale-down-unneeded-time (2m by default here),
# which could take it away just before the new worker lands, costing another boot. On spot
# stacks the node may stay empty for twice the grace period plus KubeRay's reconcile.
KUBERAY_RECREATE_S = 15  # the pod-deleted event's reconcile, the new pod's scheduling
SPOT_UNNEEDED_MARGIN = 2
SPOT_SCALE_DOWN_UNNEEDED = f"{-(-SPOT_UNNEEDED_MARGIN * (GRACE_S + KUBERAY_RECREATE_S) // 60)}m"


def autoscaler_values(cfg: StackConfig, cluster_name: pulumi.Input[str]) -> dict:
    """cluster-autoscaler's chart values; on a spot stack an empty node waits longer."""
    values = helm_values.cluster_autoscaler(
        cluster_name, cfg.region, KUBERNETES_RELEASES[cfg.kubernetes_version].cluster_autoscaler)
    if cfg.gpu_capacity is SPOT:
        values["extraArgs"]["scale-down-unneeded-time"] = SPOT_SCALE_DOWN_UNNEEDED
    return values


def export(cfg: StackConfig, target: Target, storage: CheckpointStorage,
           ray: RayWorkloads) -> None:
    """The stack outputs."""
    cost = hourly_cost(cfg, date.today())
    pulumi.export("clusterName", target.cluster_name)
    pulumi.export("kubeconfig", target.user_kubeconfig)
    pulumi.export("region", cfg.region)
    pulumi.export("gpuAvailabilityZone", target.gpu_zone)
    pulumi.export("nodeGroups", dict(target.node_groups))
    pulumi.export("idleCostUsdPerHour", cost.idle)  # no job: no GPU node
    pulumi.export("runCostUsdPerHour", cost.run)  # while a run holds its GPU nodes
    pulumi.export("hourlyCostBreakdown", dict(cost.breakdown))
    pulumi.export("costIsEstimate", cost.is_estimate)  # a Region or capacity priced at a guess
    pulumi.export("costSource", cost.source)
    pulumi.export("checkpointStorage", storage.uri)
    pulumi.export("rayNamespace", cfg.namespace)
    pulumi.export("rayJob", ray.rayjob_name)
    pulumi.export("rayHeadService", ray.head_service)
    # What `python -m runs submit` renders a run with besides the stack file (runs/outputs.py).
    pulumi.export("runsContext", pulumi.Output.from_input(target.image_cache).apply(
        lambda cache: {"stack": pulumi.get_stack(), "clusterName": cfg.name,
                       "image": through_cache(cfg.image, cache)}))
