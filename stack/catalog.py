"""Every fact the program builds on, in one Pulumi-free table per kind: instance facts, prices,
chart versions, the image, Kubernetes version. A stack overrides the image and versions through
config; nothing else in the code spells these values."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceFacts:
    vcpus: int
    memory_gib: int
    gpus: int = 0
    gpu_model: str | None = None
    gpu_memory_gib: int = 0
    efa_interfaces: int = 0  # interfaces our pods use; 0 = no EFA support
    network_gbps: int = 0


# AWS instance-type data (EC2 docs "Accelerated computing instances" and "EFA supported instance
# types"). A GPU family change is a config change: worker pods, EFA count and sizing follow this.
INSTANCES: dict[str, InstanceFacts] = {
    "m7i.xlarge": InstanceFacts(vcpus=4, memory_gib=16),
    "m7i.2xlarge": InstanceFacts(vcpus=8, memory_gib=32),
    "g6.12xlarge": InstanceFacts(vcpus=48, memory_gib=192, gpus=4, gpu_model="NVIDIA L4",
                                 gpu_memory_gib=24, efa_interfaces=1, network_gbps=40),
    "g6.48xlarge": InstanceFacts(vcpus=192, memory_gib=768, gpus=8, gpu_model="NVIDIA L4",
                                 gpu_memory_gib=24, efa_interfaces=1, network_gbps=100),
    "g6e.12xlarge": InstanceFacts(vcpus=48, memory_gib=384, gpus=4, gpu_model="NVIDIA L40S",
                                  gpu_memory_gib=48, efa_interfaces=1, network_gbps=100),
    "p5.48xlarge": InstanceFacts(vcpus=192, memory_gib=2048, gpus=8, gpu_model="NVIDIA H100",
                                 gpu_memory_gib=80, efa_interfaces=32, network_gbps=3200),
    "g5.2xlarge": InstanceFacts(vcpus=8, memory_gib=32, gpus=1, gpu_model="NVIDIA A10G",
                                gpu_memory_gib=24, efa_interfaces=0, network_gbps=10),
}

# On-demand USD per hour, us-east-1 and us-west-2 (same price in both), from the AWS EC2, EKS and
# VPC pricing pages, read 2026-11. Regions priced differently are estimated with these.
PRICES_SOURCE = "AWS on-demand pricing pages (EC2, EKS, VPC NAT gateway), us-east-1/us-west-2, 2026-11"
PRICES_USD_PER_HOUR: dict[str, float] = {
    "m7i.xlarge": 0.2016,
    "m7i.2xlarge": 0.4032,
    "g6.12xlarge": 4.6016,
    "g6.48xlarge": 13.3504,
    "g6e.12xlarge": 10.4926,
    "p5.48xlarge": 55.04,
    "g5.2xlarge": 1.212,
    "eks-control-plane": 0.10,
    "nat-gateway": 0.045,
}

KUBERNETES_VERSION = "1.34"
RAY_IMAGE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
RAY_VERSION = "2.58.0"  # the Ray inside RAY_IMAGE; RayCluster.spec.rayVersion must match


@dataclass(frozen=True)
class Chart:
    name: str
    repo: str
    version: str
    namespace: str


CHARTS: dict[str, Chart] = {
    "kuberay-operator": Chart("kuberay-operator", "https://ray-project.github.io/kuberay-helm/",
                              "1.7.0", "kuberay-system"),
    # >= 0.19.3: MOFED (all /dev/infiniband/uverbs* mounted into GPU pods) is off by default again,
    # so the NVIDIA plugin does not grab the EFA devices (NVIDIA/k8s-device-plugin#1692).
    "nvidia-device-plugin": Chart("nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin",
                                  "0.20.0", "nvidia-device-plugin"),
    "aws-efa-k8s-device-plugin": Chart("aws-efa-k8s-device-plugin", "https://aws.github.io/eks-charts",
                                       "v0.5.8", "kube-system"),
}


def kuberay_crd_urls(version: str) -> list[str]:
    """The CRDs of the pinned KubeRay release, fetched at deploy time (Helm never upgrades crds/)."""
    base = f"https://raw.githubusercontent.com/ray-project/kuberay/v{version}/helm-chart/kuberay-operator/crds"
    return [f"{base}/ray.io_{kind}.yaml" for kind in ("rayclusters", "rayjobs", "rayservices")]
