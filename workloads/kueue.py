"""Kueue's objects for the stack's runs (kueue.x-k8s.io/v1beta2, the storage version of Kueue
0.19.2's CRDs): a ResourceFlavor for the GPU nodes and one for the system nodes, a ClusterQueue
whose quota is one run of this stack, and the LocalQueue in the Ray namespace that every RayJob
names in its `kueue.x-k8s.io/queue-name` label.

How Kueue reads a RayJob (kubernetes-sigs/kueue v0.19.2 pkg/controller/jobs/rayjob): one Workload
with a PodSet for the head, one per worker group and one for the submitter Job (K8sJobMode); the
whole Workload is admitted at once or not at all, by unsuspending the RayJob (Kueue owns
`spec.suspend`; site/content/en/docs/tasks/run/rayjobs.md). Each PodSet takes the first flavor, in
the ClusterQueue's order, whose node labels its pods select and whose taints they tolerate
(pkg/scheduler/flavorassigner): the workers, which select the GPU nodes and tolerate their taint,
get the GPU flavor; the head and the submitter, on the system nodes and tolerating no GPU taint,
get the system flavor.

The GPU quota is what one run holds (gpuNodeCount x a node's GPUs, EFA interfaces, vCPUs and
memory; the worker pods ask for less than a whole node of CPU and memory, so the GPUs bind), so a
second run waits in the queue with no Ray head and no GPU node until the first one ends. The
system flavor's quota is the system node group's size: the heads and submitters of a run fit it.
"""

from __future__ import annotations

from stack.config import StackConfig
from stack.kube import GPU_TAINT

API_VERSION = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
LOCAL_QUEUE = "runs"  # in the Ray namespace: what a RayJob's queue label names
# Kueue and the API name a taint's effect NoSchedule; EKS's node-group API NO_SCHEDULE.
_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute",
            "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
COVERED = ("cpu", "memory", "nvidia.com/gpu", "vpc.amazonaws.com/efa")
NEXT_RUN_TTL_S = 0  # a finished run's cluster goes at once: the next admitted head needs its room


def cluster_queue_name(cfg: StackConfig) -> str:
    """Cluster-scoped, so named for the stack's cluster: two stacks on one existing cluster each
    have their own queue and flavors."""
    return f"{cfg.name}-runs"


def flavor_names(cfg: StackConfig) -> tuple[str, str]:
    """(GPU flavor, system flavor)."""
    return f"{cfg.name}-gpu", f"{cfg.name}-system"


def resource_flavors(cfg: StackConfig) -> list[dict]:
    """The GPU nodes as our worker pods select and tolerate them; the system nodes as the head and
    submitter select them. The GPU taint is the node group's (stack/kube.py) on this stack's own
    cluster; on an existing one its GPU nodes may carry none, and a flavor taint only demands
    that pods tolerate it, which ours do."""
    gpu, system = flavor_names(cfg)
    taint = {"key": GPU_TAINT["key"], "value": GPU_TAINT["value"],
             "effect": _EFFECTS[GPU_TAINT["effect"]]}
    return [
        {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": gpu},
         "spec": {"nodeLabels": dict(cfg.gpu_node_selector), "nodeTaints": [taint]}},
        {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": system},
         "spec": {"nodeLabels": dict(cfg.system_node_selector)}},
    ]


def _quota(cpu: int, memory_gib: int, gpus: int, efa: int) -> list[dict]:
    values = (str(cpu), f"{memory_gib}Gi", str(gpus), str(efa))
    return [{"name": name, "nominalQuota": value} for name, value in zip(COVERED, values)]


def cluster_queue(cfg: StackConfig) -> dict:
    """One resource group over every resource our pods request (a resource no group covers makes
    Kueue refuse the Workload), the GPU flavor first. StrictFIFO: runs start in the order they
    were submitted, a large one is never overtaken by later ones."""
    gpu, system = flavor_names(cfg)
    n, node, sys_n, sys_node = cfg.gpu_node_count, cfg.gpu, cfg.system_node_count, cfg.system
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue_name(cfg)},
            "spec": {
                "namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": cfg.namespace}},
                "queueingStrategy": "StrictFIFO",
                "resourceGroups": [{"coveredResources": list(COVERED), "flavors": [
                    {"name": gpu, "resources": _quota(n * node.vcpus, n * node.memory_gib,
                                                      n * node.gpus, n * node.efa_interfaces)},
                    {"name": system, "resources": _quota(sys_n * sys_node.vcpus,
                                                         sys_n * sys_node.memory_gib, 0, 0)},
                ]}]}}


def local_queue(cfg: StackConfig) -> dict:
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": LOCAL_QUEUE, "namespace": cfg.namespace},
            "spec": {"clusterQueue": cluster_queue_name(cfg)}}


def queue_objects(cfg: StackConfig) -> list[dict]:
    """In the order they must exist: flavors, then the ClusterQueue, then the LocalQueue."""
    return [*resource_flavors(cfg), cluster_queue(cfg), local_queue(cfg)]


def queued(job: dict, cfg: StackConfig) -> dict:
    """A RayJob manifest handed to Kueue: the queue label, and created suspended so that KubeRay
    creates nothing until Kueue admits it. KubeRay 1.7.0 sets `status.startTime` when a RayJob
    leaves New (initRayJobStatusIfNeed) and again when an unsuspended one goes Suspended -> New ->
    Initializing (the Suspending branch clears jobId and rayClusterName, so it is re-initialised);
    it checks activeDeadlineSeconds and preRunningDeadlineSeconds only in Initializing and
    Running, never while Suspended (ray-operator/controllers/ray/rayjob_controller.go). So the
    deadlines count from admission: a run waiting in the queue never expires. Kueue's RayJob
    integration needs shutdownAfterJobFinishes, which the builder always sets.

    The finished run's cluster goes at once (ttlSecondsAfterFinished 0): Kueue frees a run's
    quota when its RayJob finishes and admits the next, but KubeRay deletes the finished
    cluster only at status.endTime + ttlSecondsAfterFinished (rayjob_controller.go, Complete/
    Failed: shutdownTime not After now -> delete the cluster; the submitter Job, with the
    driver's log, is kept). A run's system pods (head 2 vCPU/8 GiB, scale-up watch, submitter)
    fit once on one m7i.xlarge beside the add-ons, not twice (SYSTEM_FIT in the tests): with the
    300 s grace the next head would wait that long after its admission, inside its own
    preRunningDeadlineSeconds, counted as its cold start."""
    if not cfg.queue:
        return job
    meta = job["metadata"]
    return {**job, "metadata": {**meta, "labels": {**meta.get("labels", {}),
                                                   QUEUE_LABEL: LOCAL_QUEUE}},
            "spec": {**job["spec"], "suspend": True,
                     "ttlSecondsAfterFinished": NEXT_RUN_TTL_S}}
