"""Target an existing EKS cluster: only add-ons and Ray workloads are deployed onto it, after
checking that it has what they need."""

from __future__ import annotations

from typing import Mapping, Sequence

import pulumi
import pulumi_aws as aws

from infra.existing_kueue import refuse_foreign_kueue
from infra.kubeconfig import kubeconfigs
from infra.lookups import found
from stack.config import StackConfig
from stack.kube import GPU_LABELS, GPU_TAINT
from training.errors import InputError

POD_IDENTITY_ADDON = "eks-pod-identity-agent"


class ExistingClusterError(InputError):
    """The existing cluster lacks what the add-ons and Ray pods need; every gap, with its fix."""


def lookup(cfg: StackConfig, profile: str | None
           ) -> tuple[str, pulumi.Output[str], pulumi.Output[str]]:
    """(cluster name, kubeconfig for the Kubernetes provider, kubeconfig to export), once the
    cluster passed `missing` and has no Kueue that would collide with the stack's
    (infra/existing_kueue.py); raises ExistingClusterError or ExistingKueueError before any
    resource is declared."""
    name = cfg.existing_cluster_name
    cluster = aws.eks.get_cluster(name=name)
    groups = {g: aws.eks.get_node_group(cluster_name=name, node_group_name=g)
              for g in aws.eks.get_node_groups(cluster_name=name).names}
    problems = missing(cfg, {g: (ng.labels or {}, [(t.key, t.effect) for t in ng.taints or []])
                             for g, ng in groups.items()}, _has_addon(name, POD_IDENTITY_ADDON))
    if problems:
        raise ExistingClusterError(f"existingClusterName: {name} is not ready for this stack:\n"
                                   + "\n".join(f"  - {p}" for p in problems))
    ca_data = cluster.certificate_authorities[0].data
    refuse_foreign_kueue(cfg, cluster.endpoint, ca_data)  # its Kubernetes API, once AWS's pass
    return (cluster.name, *kubeconfigs(cluster.name, cluster.endpoint, ca_data, cfg.region,
                                       profile))


def _has_addon(cluster: str, addon: str) -> bool:
    """DescribeAddon answers ResourceNotFoundException for an add-on the cluster lacks."""
    return found(lambda: aws.eks.get_addon(cluster_name=cluster, addon_name=addon)) is not None


def missing(cfg: StackConfig,
            groups: Mapping[str, tuple[Mapping[str, str], Sequence[tuple[str, str]]]],
            has_pod_identity: bool) -> list[str]:
    """What the cluster lacks: a node group labelled for the KubeRay operator and Ray head, a GPU
    node group with the labels the pods and device plugins select and the GPU taint the worker
    pods tolerate (keeping other pods off the GPUs), and the Pod Identity agent (S3 access).
    `groups`: node group name -> (labels, [(taint key, effect)])."""
    def labelled(selector: Mapping[str, str]) -> list[str]:
        return [g for g, (labels, _) in groups.items()
                if all(labels.get(k) == v for k, v in selector.items())]

    problems = []
    if not labelled(cfg.system_node_selector):
        problems.append(f"no node group is labelled {dict(cfg.system_node_selector)} (KubeRay operator, "
                        "Ray head): label one, or set systemNodeSelector to its labels")
    gpu_selector = {**cfg.gpu_node_selector, **{k: v for k, v in GPU_LABELS.items() if k != "role"}}
    gpu_groups = labelled(gpu_selector)
    if not gpu_groups:
        problems.append(f"no node group is labelled {gpu_selector} (Ray workers, NVIDIA and EFA device "
                        "plugins): label the GPU node group, or set gpuNodeSelector to its labels")
    taint = (GPU_TAINT["key"], GPU_TAINT["effect"])
    for g in gpu_groups:
        if taint not in groups[g][1]:
            problems.append(f"node group {g} lacks the taint {GPU_TAINT['key']}={GPU_TAINT['value']}:"
                            f"NoSchedule that keeps other pods off its GPUs: add it")
    if not has_pod_identity:
        problems.append(f"the {POD_IDENTITY_ADDON} add-on is missing (Ray pods reach S3 through Pod "
                        f"Identity): aws eks create-addon --cluster-name {cfg.existing_cluster_name} "
                        f"--addon-name {POD_IDENTITY_ADDON}, or install the agent otherwise (a "
                        "self-managed agent is not an add-on and is not seen here)")
    return problems
