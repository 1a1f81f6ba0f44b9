"""Every fact the program builds on, in one Pulumi-free table per kind: instance facts, prices,
chart versions, the image, Kubernetes version. A stack overrides the image and versions through
config; nothing else in the code spells these values."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date


@dataclass(frozen=True)
class InstanceFacts:
    vcpus: int
    memory_gib: int
    gpus: int = 0
    gpu_model: str | None = None
    gpu_memory_gib: int = 0
    efa_interfaces: int = 0  # interfaces our pods use; 0 = no EFA support
    network_gbps: int = 0
    # Sold as EC2 Capacity Blocks for ML (EC2 user guide, "Capacity Blocks prerequisites"; the EKS
    # user guide's ml/capacity-blocks-mng example uses p5.48xlarge). False = not known to be.
    capacity_blocks: bool = False

    @property
    def accelerator(self) -> str | None:
        """Value of the `k8s.amazonaws.com/accelerator` node label, e.g. "nvidia-l4"."""
        return self.gpu_model.lower().replace(" ", "-") if self.gpu_model else None


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
                                 gpu_memory_gib=80, efa_interfaces=32, network_gbps=3200,
                                 capacity_blocks=True),
    "g5.2xlarge": InstanceFacts(vcpus=8, memory_gib=32, gpus=1, gpu_model="NVIDIA A10G",
                                gpu_memory_gib=24, efa_interfaces=0, network_gbps=10),
}

# On-demand USD per hour, us-east-1 and us-west-2 (same price in both), from the AWS EC2, EKS,
# VPC (NAT gateway; public IPv4 addresses, in use or not) and EBS pricing pages, read 2026-11.
# Regions priced differently are estimated with these.
PRICES_SOURCE = ("AWS on-demand pricing pages (EC2, EKS, VPC NAT gateway and public IPv4, EBS gp3), "
                 "us-east-1/us-west-2, 2026-11")
PRICES_USD_PER_HOUR: dict[str, float] = {
    "m7i.xlarge": 0.2016,
    "m7i.2xlarge": 0.4032,
    "g6.12xlarge": 4.6016,
    "g6.48xlarge": 13.3504,
    "g6e.12xlarge": 10.4926,
    "p5.48xlarge": 55.04,
    "g5.2xlarge": 1.212,
    "eks-control-plane": 0.10,  # a Kubernetes version in standard support
    "eks-control-plane-extended": 0.60,  # the same cluster once its version is in extended support
    "nat-gateway": 0.045,
    "public-ipv4": 0.005,  # the NAT gateway's Elastic IP
    # gp3 storage is 0.08 USD per GB-month, prorated by the second over a 30-day month (the EBS
    # pricing page's example): per GB-hour, 0.08 / 720.
    "gp3-gb": round(0.08 / 720, 8),
}



@dataclass(frozen=True)
class KubernetesRelease:
    """What a cluster of one Kubernetes minor runs: its EKS standard-support end (the control plane
    bills the extended price after it), the EKS add-on versions and the cluster-autoscaler image,
    whose minor must equal the cluster's (kubernetes/autoscaler cluster-autoscaler/README.md: CA
    versions match Kubernetes minor releases; it simulates that minor's scheduler)."""

    standard_support_end: date
    coredns: str
    pod_identity_agent: str
    cluster_autoscaler: str


# Standard-support ends: EKS user guide, kubernetes-versions-standard (1.34: 2026-12-02;
# 1.35: 2027-03-27). CoreDNS: the user guide's managing-coredns version table (v1.13.2-eksbuild.4
# for 1.33-1.35). Pod Identity agent: the version EKS resolved on a 1.36 cluster (its versions are
# not per Kubernetes minor). cluster-autoscaler: the newest patch tag of each minor in
# kubernetes/autoscaler (cluster-autoscaler-1.34.5, cluster-autoscaler-1.35.2).
# `aws eks describe-addon-versions --kubernetes-version 1.35 --addon-name coredns` checks a pin.
KUBERNETES_RELEASES: dict[str, KubernetesRelease] = {
    "1.34": KubernetesRelease(date(2026, 12, 2), coredns="v1.13.2-eksbuild.4",
                              pod_identity_agent="v1.3.10-eksbuild.3", cluster_autoscaler="v1.34.5"),
    "1.35": KubernetesRelease(date(2027, 3, 27), coredns="v1.13.2-eksbuild.4",
                              pod_identity_agent="v1.3.10-eksbuild.3", cluster_autoscaler="v1.35.2"),
}
KUBERNETES_VERSION = "1.35"  # in EKS standard support; 1.34 bills extended support from 2026-12-02
CLUSTER_AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
RAY_IMAGE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
RAY_VERSION = "2.58.0"  # the Ray inside RAY_IMAGE; RayCluster.spec.rayVersion must match
# The MLflow client the job installs at submission (runtime_env pip) when tracking is on: the
# image ships none (aws/deep-learning-containers docker/ray-train/uv.lock, the newest lockfile
# stored, for Ray 2.56 / v1.0, lists no mlflow; v1.1's was not found). The skinny client: the
# full `mlflow` package also pulls a server, scikit-learn and pandas. requirements.txt pins the
# same version for the tests (tests/workloads/test_manifests.py checks they agree).
MLFLOW_CLIENT = "mlflow-skinny==3.17.2"


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
    # v0.5.30 installs plugin image v0.5.20 (aws/eks-charts index.yaml; v0.5.8 installed v0.5.5).
    "aws-efa-k8s-device-plugin": Chart("aws-efa-k8s-device-plugin", "https://aws.github.io/eks-charts",
                                       "v0.5.30", "kube-system"),
    # kubernetes/autoscaler's chart (its gh-pages index.yaml); the image tag comes from
    # KUBERNETES_RELEASES so that its minor follows the cluster's.
    "cluster-autoscaler": Chart("cluster-autoscaler", "https://kubernetes.github.io/autoscaler",
                                "9.59.0", "kube-system"),
}


def kuberay_crd_urls(version: str) -> list[str]:
    """The CRDs of the pinned KubeRay release, fetched at deploy time (Helm never upgrades crds/)."""
    base = f"https://raw.githubusercontent.com/ray-project/kuberay/v{version}/helm-chart/kuberay-operator/crds"
    return [f"{base}/ray.io_{kind}.yaml" for kind in ("rayclusters", "rayjobs", "rayservices")]
