"""Node labels and taints shared by the node groups (infra) and the pods that target them
(workloads). Pulumi-free."""

SYSTEM_LABELS = {"role": "system"}
GPU_LABELS = {"role": "gpu-worker", "nvidia.com/gpu.present": "true",
              "vpc.amazonaws.com/efa.present": "true"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}
GPU_TOLERATION = {"key": GPU_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}
