"""Kubernetes names, labels, taints and limits shared by the node groups (infra) and the objects
that target them (workloads). Pulumi-free."""

# Namespaced objects of the Ray workloads, and the AWS resources that refer to them.
NAMESPACE = "ray"
SERVICE_ACCOUNT = "ray-train"  # head and workers; Pod Identity maps it to the bucket role
HF_TOKEN_SECRET = "hf-token"
CODE_CONFIGMAP = "training-code"
CODE_MOUNT = "/home/ray/code"  # in the submitter pod; `ray job submit` uploads it as working_dir

# Node labels and the GPU taint: set on the node groups, selected and tolerated by the pods.
SYSTEM_LABELS = {"role": "system"}
GPU_LABELS = {"role": "gpu-worker", "nvidia.com/gpu.present": "true",
              "vpc.amazonaws.com/efa.present": "true"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}
GPU_TOLERATION = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}

# Object names derived from clusterName, and their limits (KubeRay: RayCluster <= 53, RayJob <= 47).
EKS_NAME_MAX = 100
RAYCLUSTER_NAME_MAX = 53
RAYJOB_NAME_MAX = 47
JOB_HASH_LEN = 10  # RayJob name = f"{clusterName}-{hash}"
