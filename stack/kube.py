"""Kubernetes names, labels, taints and limits shared by the node groups (infra) and the objects
that target them (workloads). Pulumi-free."""

import hashlib
import re

# Namespaced objects of the Ray workloads, and the AWS resources that refer to them.
NAMESPACE = "ray"
SERVICE_ACCOUNT = "ray-train"  # head and workers; Pod Identity maps it to the bucket role
HF_TOKEN_SECRET = "hf-token"
MLFLOW_SECRET = "mlflow-tracking"  # keys username, password (stack/tracking.py)
CODE_MOUNT = "/home/ray/code"  # in the submitter pod; `ray job submit` uploads it as working_dir
# cluster-autoscaler's service account: its Helm release names it, its Pod Identity role maps it.
AUTOSCALER_NAMESPACE = "kube-system"
AUTOSCALER_SERVICE_ACCOUNT = "cluster-autoscaler"

# Node labels and the GPU taint: set on the node groups, selected and tolerated by the pods.
SYSTEM_LABELS = {"role": "system"}
GPU_LABELS = {"role": "gpu-worker", "nvidia.com/gpu.present": "true",
              "vpc.amazonaws.com/efa.present": "true"}
# What the Ray workers select on this stack's own GPU nodes (gpuNodeSelector's default).
GPU_SELECTOR = {"role": GPU_LABELS["role"]}
# cluster-autoscaler treats a node with this label as a GPU node and waits for its GPUs to appear
# instead of scaling up again while the device plugin starts (cloudprovider/aws GPULabel). The value
# is the GPU's name from the instance table (`InstanceFacts.accelerator`), e.g. "nvidia-l4".
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}
GPU_TOLERATION = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}


# How a message points at the run holding GPU nodes: by the tool that lists every run, the
# stack's own and submitted ones, on a `runJob: false` stack too (where the rayJob output is
# empty), and ends the one named.
END_A_RUN = ("`python -m runs list` names the run holding them, `python -m runs cancel NAME` "
             "ends it (its checkpoints stay)")

# A run's code: the digest of the bundle it carries (workloads/code_bundle.py), on its RayJob.
CODE_DIGEST_ANNOTATION = "eks-ray-train/code-digest"


def code_configmap_name(rayjob_name: str, digest: str) -> str:
    """A run's own code ConfigMap: named for its RayJob and its bundle's digest, so a run never
    mounts another run's code, nor a ConfigMap whose keys differ from its volume's items."""
    return f"{rayjob_name}-code-{digest[:12]}"


# Kueue's chart names its objects `<release>-<suffix>` (a release name holding "kueue" is the
# chart's fullname: kubernetes-sigs/kueue v0.19.2 charts/kueue/templates/_helpers.tpl), and its
# longest Service name, `<release>-controller-manager-metrics-service`, must be a DNS-1035 label
# of at most 63 characters.
KUEUE_RELEASE_MAX = 63 - len("-controller-manager-metrics-service")


def kueue_release_name(cluster_name: str) -> str:
    """The Helm release of the Kueue a stack installs on an existing cluster, named for the stack:
    Helm stamps it on Kueue's CRDs, so a later `pulumi up` tells its own install from another's
    (infra/existing_kueue.py)."""
    return within(f"kueue-{cluster_name}", KUEUE_RELEASE_MAX)


def within(name: str, limit: int, key: str | None = None) -> str:
    """`name` if it fits `limit` characters, else its start, '-' and 8 hex digits of a hash of
    `key` (`name` by default): still one name per key."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256((key or name).encode()).hexdigest()[:8]
    return f"{name[:limit - 9].rstrip('-')}-{digest}"


def gpu_node_labels(accelerator: str) -> dict[str, str]:
    """Every label of a GPU node: the shared ones plus the accelerator name."""
    return {**GPU_LABELS, ACCELERATOR_LABEL: accelerator}


# Object names derived from clusterName, and their limits (KubeRay: RayCluster <= 53, RayJob <= 47).
EKS_NAME_MAX = 100
RAYCLUSTER_NAME_MAX = 53
RAYJOB_NAME_MAX = 47
JOB_HASH_LEN = 10  # RayJob name = f"{clusterName}-{hash}"

# How long a run may take from the RayJob's start to the job's submission (KubeRay counts
# preRunningDeadlineSeconds while the run's cluster is not Ready, i.e. until every pod runs:
# rayjob_controller.go checkPreRunningDeadline). Budgets, not measurements, for scale-from-zero:
# cluster-autoscaler reacts and EC2 boots a GPU node that joins and starts its device plugins,
# then each node pulls the multi-GiB Ray Train CUDA image.
NODE_BOOT_S, IMAGE_PULL_S = 600, 900
RUN_START_BUDGET_S = NODE_BOOT_S + IMAGE_PULL_S


def default_cluster_name(project: str, stack: str) -> str:
    """`<project>-<stack>` made a valid clusterName: lowercase letters, digits and '-', starting
    with a letter, short enough for the RayJob names derived from it."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"{project}-{stack}".lower()).lstrip("-0123456789")
    return (name or "ray-train")[:RAYJOB_NAME_MAX - JOB_HASH_LEN - 1].rstrip("-")
