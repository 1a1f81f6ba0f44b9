"""Values for the Helm charts: each add-on on the nodes it belongs to."""

from __future__ import annotations

import pulumi
import yaml

from stack.catalog import CLUSTER_AUTOSCALER_IMAGE
from stack.images import efa_plugin_repository
from stack.kube import AUTOSCALER_SERVICE_ACCOUNT, GPU_LABELS, GPU_TOLERATION, SYSTEM_LABELS

# Idle GPU nodes go this long after the per-run Ray cluster does (the chart's defaults are 10m).
SCALE_DOWN_AFTER = "2m"


def kuberay_operator(node_selector: dict[str, str]) -> dict:
    """On the system node. CRDs come from the pinned release (see workloads/addons.py)."""
    return {"nodeSelector": dict(node_selector),
            "resources": {"requests": {"cpu": "100m", "memory": "512Mi"},
                          "limits": {"cpu": "100m", "memory": "512Mi"}}}


# The chart's own manager Configuration (kubernetes-sigs/kueue v0.19.2 charts/kueue/values.yaml,
# managerConfig.controllerManagerConfigYaml): a value for that key replaces the whole text, so
# every field the chart sets is repeated here and only the integrations and namespaces differ.
KUEUE_MANAGER_CONFIG = {
    "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
    "health": {"healthProbeBindAddress": ":8081"},
    "metrics": {"bindAddress": ":8443"},
    "webhook": {"port": 9443},
    "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
    "controller": {"groupKindConcurrency": {
        "Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 10,
        "LocalQueue.kueue.x-k8s.io": 5, "ClusterQueue.kueue.x-k8s.io": 5,
        "ResourceFlavor.kueue.x-k8s.io": 1}},
    "clientConnection": {"qps": 300, "burst": 500},
}
KUEUE_FRAMEWORKS = ["ray.io/rayjob"]  # the only kind of object this stack queues


def kueue_manager_config(namespace: str) -> dict:
    """Kueue scoped to our RayJobs. The chart's default integrations include `pod`,
    `deployment`, `statefulset` and `batch/job`, and its webhook template
    (charts/kueue/templates/webhook/manifests.yaml) renders each with `failurePolicy: Fail`
    on every namespace but kube-system and Kueue's own: while the one Kueue pod is down no
    Deployment or Pod could be created anywhere. With `ray.io/rayjob` alone the pod,
    deployment and statefulset webhooks render `failurePolicy: Ignore`, and with
    `managedJobsNamespaceSelector` every job webhook's namespaceSelector is the stack's Ray
    namespace (the template copies it verbatim). A disabled integration's webhook is Kueue's
    no-op one (pkg/controller/jobframework/noop_webhook.go): it admits everything."""
    return {**KUEUE_MANAGER_CONFIG,
            "managedJobsNamespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": namespace}},
            "integrations": {"frameworks": list(KUEUE_FRAMEWORKS)}}


def kueue(node_selector: dict[str, str], namespace: str) -> dict:
    """Kueue's controller on the system node (the chart's `controllerManager.nodeSelector`, empty
    by default), managing RayJobs in `namespace` only (kueue_manager_config); among those only
    the ones with a queue label (its Configuration sets no manageJobsWithoutQueueName, false by
    default). The chart requests 500m CPU: on an m7i.xlarge beside the operator, the autoscaler
    and a run's head that is more than is left, and the controller idles between admissions."""
    return {"controllerManager": {
        "nodeSelector": dict(node_selector),
        "manager": {"resources": {"requests": {"cpu": "100m", "memory": "512Mi"},
                                  "limits": {"cpu": "500m", "memory": "512Mi"}}}},
            "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(
                kueue_manager_config(namespace), sort_keys=False)}}


def nvidia_device_plugin() -> dict:
    """Only on GPU nodes, tolerating their taint. The pinned chart (>= 0.19.3) leaves MOFED off,
    so /dev/infiniband/uverbs* stay with the EFA plugin."""
    return {"nodeSelector": {"nvidia.com/gpu.present": GPU_LABELS["nvidia.com/gpu.present"]},
            "tolerations": [GPU_TOLERATION]}


def efa_device_plugin(region: str) -> dict:
    """On EFA nodes, tolerating the GPU taint: the chart's DaemonSet tolerates only
    CriticalAddonsOnly plus `tolerations` (empty by default; aws/eks-charts
    stable/aws-efa-k8s-device-plugin templates/daemonset.yaml). Its image from the stack's own
    Region's EKS registry (the chart's values.yaml names us-west-2's); the tag stays the chart's."""
    return {"nodeSelector": {"vpc.amazonaws.com/efa.present":
                             GPU_LABELS["vpc.amazonaws.com/efa.present"]},
            "tolerations": [GPU_TOLERATION],
            "image": {"repository": efa_plugin_repository(region)}}


def cluster_autoscaler(cluster_name: pulumi.Input[str], region: str, image_tag: str) -> dict:
    """kubernetes/autoscaler's chart on the system node, discovering the cluster's managed node
    groups by the tags EKS puts on them. The GPU node group is one subnet (one zone) with one
    placement group, so every GPU node it adds lands there; `balance-similar-node-groups` stays
    off so that a similar group elsewhere is never used to spread a run, and `least-waste` picks
    the group a pending pod fits best rather than a random one."""
    return {
        "cloudProvider": "aws",
        "awsRegion": region,  # no metadata-service lookup: nodes allow one hop only
        "autoDiscovery": {"clusterName": cluster_name},
        "image": {"repository": CLUSTER_AUTOSCALER_IMAGE, "tag": image_tag},
        # Deployment and service account both named cluster-autoscaler (not release-name-based):
        # the Pod Identity association and the kubectl commands of docs/running-on-eks.md use the name.
        "fullnameOverride": AUTOSCALER_SERVICE_ACCOUNT,
        "rbac": {"serviceAccount": {"name": AUTOSCALER_SERVICE_ACCOUNT}},
        "nodeSelector": dict(SYSTEM_LABELS),
        "resources": {"requests": {"cpu": "100m", "memory": "600Mi"},
                      "limits": {"cpu": "100m", "memory": "600Mi"}},
        "extraArgs": {
            "expander": "least-waste",
            "balance-similar-node-groups": False,
            "scale-down-unneeded-time": SCALE_DOWN_AFTER,
            "scale-down-delay-after-add": SCALE_DOWN_AFTER,
        },
    }
