"""Every fact the program builds on, in one Pulumi-free table per kind: instance facts, prices,
chart versions, the image, Kubernetes version. A stack overrides the image and versions through
config; nothing else in the code spells these values."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date
from typing import Mapping


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
    # The lowest bus bandwidth (GB/s, NCCL-tests' busbw) a healthy link between two such nodes
    # gives the job's warm-up probe (training/network/link_floor.py); None: no floor (no EFA).
    # `efa_floor_basis` says whether it was measured or derived, and from what.
    efa_floor_gbps: float | None = None
    efa_floor_basis: str | None = None

    @property
    def accelerator(self) -> str | None:
        """Value of the `k8s.amazonaws.com/accelerator` node label, e.g. "nvidia-l4"."""
        return self.gpu_model.lower().replace(" ", "-") if self.gpu_model else None


# Every EFA floor below is derived, none measured (no EFA hardware has been reachable): half the
# node's line rate in bytes. The basis: a healthy NCCL all-reduce over the link reaches about 80%
# of line rate in bus bandwidth (4.0 GB/s of one 40 Gbps EFA link is the step model's default
# input, and with it the model predicts the AWS sample's published 8 x L4 EFA run within 4.6%:
# bench/NOTES.md, bench/MODEL.md); 2.5 GB/s is the model's pessimistic input, with which that
# check is off by 40%. Half of line rate (62% of a healthy link) is below both: a link under it
# is degraded, not noisy. Replace a derived floor with a measured one when a probe on the
# instance type says so (the job logs the probe: `link:` and the summary's *_busbw_gbps).
EFA_FLOOR_SHARE_OF_LINE_RATE = 0.5


def _derived_floor(network_gbps: int) -> dict:
    floor = network_gbps / 8 * EFA_FLOOR_SHARE_OF_LINE_RATE
    return {"efa_floor_gbps": floor,
            "efa_floor_basis": f"derived: {EFA_FLOOR_SHARE_OF_LINE_RATE:.0%} of the {network_gbps} "
                               f"Gbps line rate ({network_gbps / 8:g} GB/s)"}


# AWS instance-type data (EC2 docs "Accelerated computing instances" and "EFA supported instance
# types"). A GPU family change is a config change: worker pods, EFA count and sizing follow this.
INSTANCES: dict[str, InstanceFacts] = {
    "m7i.xlarge": InstanceFacts(vcpus=4, memory_gib=16),
    "m7i.2xlarge": InstanceFacts(vcpus=8, memory_gib=32),
    "g6.12xlarge": InstanceFacts(vcpus=48, memory_gib=192, gpus=4, gpu_model="NVIDIA L4",
                                 gpu_memory_gib=24, efa_interfaces=1, network_gbps=40,
                                 **_derived_floor(40)),
    "g6.48xlarge": InstanceFacts(vcpus=192, memory_gib=768, gpus=8, gpu_model="NVIDIA L4",
                                 gpu_memory_gib=24, efa_interfaces=1, network_gbps=100,
                                 **_derived_floor(100)),
    "g6e.12xlarge": InstanceFacts(vcpus=48, memory_gib=384, gpus=4, gpu_model="NVIDIA L40S",
                                  gpu_memory_gib=48, efa_interfaces=1, network_gbps=100,
                                  **_derived_floor(100)),
    "p5.48xlarge": InstanceFacts(vcpus=192, memory_gib=2048, gpus=8, gpu_model="NVIDIA H100",
                                 gpu_memory_gib=80, efa_interfaces=32, network_gbps=3200,
                                 capacity_blocks=True, **_derived_floor(3200)),
    "g5.2xlarge": InstanceFacts(vcpus=8, memory_gib=32, gpus=1, gpu_model="NVIDIA A10G",
                                gpu_memory_gib=24, efa_interfaces=0, network_gbps=10),
}

# On-demand USD per hour by Region: only Regions whose prices were read from AWS's pricing pages
# (EC2, EKS, VPC NAT gateway and public IPv4 addresses in use or not, EBS) are here. A Region
# that is not gets the ESTIMATE_REGION's prices, and the cost outputs say they are an estimate
# (infra/cost.py): other Regions' prices may differ, and no price is written here that was not
# read.
_US_PRICES: dict[str, float] = {
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
    # gp3 performance above the free baseline (125 MiB/s, 3,000 IOPS): 0.040 USD per provisioned
    # MiB/s-month and 0.005 USD per provisioned IOPS-month (EBS pricing page), prorated the same way.
    "gp3-mibps": round(0.04 / 720, 8),
    "gp3-iops": round(0.005 / 720, 8),
}
PRICES_USD_PER_HOUR: dict[str, dict[str, float]] = {
    "us-east-1": _US_PRICES,  # read 2026-11: the same prices in both Regions
    "us-west-2": _US_PRICES,
}
PRICES_SOURCE = ("AWS on-demand pricing pages (EC2, EKS, VPC NAT gateway and public IPv4, "
                 "EBS gp3), read 2026-11")
ESTIMATE_REGION = "us-east-1"


def region_prices(region: str) -> tuple[dict[str, float], bool, str]:
    """(prices, whether they are an estimate, where they come from) for a Region: its own
    prices where the table has them, else ESTIMATE_REGION's, labelled as an estimate (the cost
    outputs and the run's cold-start dollars both read it)."""
    if region in PRICES_USD_PER_HOUR:
        return PRICES_USD_PER_HOUR[region], False, f"{PRICES_SOURCE}, {region}"
    return (PRICES_USD_PER_HOUR[ESTIMATE_REGION], True,
            f"estimate: {ESTIMATE_REGION} prices ({PRICES_SOURCE}); stack/catalog.py has no "
            f"prices for {region}, whose prices may differ")


@dataclass(frozen=True)
class ServiceQuota:
    """An EC2 vCPU quota (On-Demand or Spot) in Service Quotas (service code `ec2`)."""

    code: str
    name: str


_STANDARD = ServiceQuota("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) "
                                       "instances")
# The On-Demand quotas count running vCPUs per instance family, one quota per group of families
# (EC2 user guide, ec2-on-demand-instances "On-Demand Instance quotas"; the codes as Service Quotas
# lists them, e.g. `aws service-quotas list-service-quotas --service-code ec2`). Keyed by the
# letters an instance type starts with ("g6e.12xlarge": "g"); inf, trn, x, hpc... have quotas of
# their own, not listed here.
ON_DEMAND_QUOTAS: dict[str, ServiceQuota] = {
    **{letter: _STANDARD for letter in ("a", "c", "d", "h", "i", "m", "r", "t", "z")},
    "g": ServiceQuota("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "vt": ServiceQuota("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "p": ServiceQuota("L-417A185B", "Running On-Demand P instances"),
}


# Spot: one quota per group of families for all Spot Instance requests, in vCPUs (Service Quotas,
# ec2: "All G and VT Spot Instance Requests" L-3819A6DF, "All P Spot Instance Requests"
# L-7212CCBC, as the design notes of 2026-12-01 record them). Other families are not listed.
SPOT_QUOTAS: dict[str, ServiceQuota] = {
    **{family: ServiceQuota("L-3819A6DF", "All G and VT Spot Instance Requests")
       for family in ("g", "vt")},
    "p": ServiceQuota("L-7212CCBC", "All P Spot Instance Requests"),
}


# No Spot price was read for this table: EC2 sets it per zone and changes it over time. What the
# cost outputs give for spot GPU nodes is its ceiling, labelled an estimate: a launch without a
# maximum price (EKS managed node groups set none) pays "the current Spot price" (EC2 API,
# LaunchTemplateSpotMarketOptions.MaxPrice), capped by default at the On-Demand price (AWS Batch
# documents the same default, ComputeResource.bidPercentage: "the default value is 100% of the
# On-Demand price"), so a spot node bills at most the on-demand price here, usually less.
SPOT_ESTIMATE = ("estimate: spot GPU nodes at their ceiling, the on-demand price (spot's default "
                 "maximum price); they usually bill less: aws ec2 describe-spot-price-history "
                 "--instance-types {instance_type} --product-descriptions Linux/UNIX "
                 "--start-time $(date -u +%FT%T) --region {region}")


@dataclass(frozen=True, eq=False)  # one record per way of buying: compared by identity
class GpuCapacity:
    """How the GPU nodes are bought, in every spelling the program needs: `name` as the stack
    (gpuCapacityType) and the head pod's environment spell it, `eks_name` as a managed node
    group's capacityType (EKS API reference, Nodegroup.capacityType: ON_DEMAND, SPOT,
    CAPACITY_BLOCK), and the vCPU quota its launches count against, per instance family. The
    stack config holds one (StackConfig.gpu_capacity); the node group, the quota check, the cost
    outputs and the scale-up watch all read that one."""

    name: str
    eks_name: str
    # Keyed by the letters an instance type starts with ("g6e.12xlarge": "g"); a family not
    # listed has no quota here (checked by nobody, named by no fix).
    quotas: Mapping[str, ServiceQuota]
    # Set where the cost outputs' price of these nodes is an estimate: why, as a format string
    # of {instance_type} and {region}.
    price_estimate: str | None = None
    # The stack key gpuCapacityType names it; a capacity block follows from capacityBlock.
    selectable: bool = True

    def vcpu_quota(self, instance_type: str) -> ServiceQuota | None:
        """The quota an instance type's vCPUs count against when bought this way; None for a
        family not listed."""
        return self.quotas.get(re.match(r"[a-z]*", instance_type)[0])


ON_DEMAND = GpuCapacity("on-demand", "ON_DEMAND", ON_DEMAND_QUOTAS)
SPOT = GpuCapacity("spot", "SPOT", SPOT_QUOTAS, price_estimate=SPOT_ESTIMATE)
# Capacity Blocks are bought under limits of their own (up to 64 instances a block, 256 across
# blocks: EC2 user guide, capacity-blocks-purchase), not a running-vCPU quota: none listed.
CAPACITY_BLOCK = GpuCapacity("capacity-block", "CAPACITY_BLOCK", {}, selectable=False)
# The values of the stack key gpuCapacityType.
CAPACITY_TYPES: dict[str, GpuCapacity] = {
    c.name: c for c in (ON_DEMAND, SPOT, CAPACITY_BLOCK) if c.selectable}


# The Amazon EKS add-on image registries, one account per Region (EKS user guide,
# workloads/add-ons-images "View Amazon container image registries for Amazon EKS add-ons"):
# EKS replicates the add-on images, the EFA device plugin's among them, to each Region's registry,
# which the node role's AmazonEC2ContainerRegistryReadOnly policy may pull from.
EKS_ADDON_REGISTRY_ACCOUNTS: dict[str, str] = {
    "af-south-1": "877085696533", "ap-east-1": "800184023465", "ap-east-2": "533267051163",
    "ap-northeast-1": "602401143452", "ap-northeast-2": "602401143452",
    "ap-northeast-3": "602401143452", "ap-south-1": "602401143452", "ap-south-2": "900889452093",
    "ap-southeast-1": "602401143452", "ap-southeast-2": "602401143452",
    "ap-southeast-3": "296578399912", "ap-southeast-4": "491585149902",
    "ap-southeast-5": "151610086707", "ap-southeast-6": "333609536671",
    "ap-southeast-7": "121268973566", "ca-central-1": "602401143452",
    "ca-west-1": "761377655185", "cn-north-1": "918309763551", "cn-northwest-1": "961992271922",
    "eu-central-1": "602401143452", "eu-central-2": "900612956339", "eu-north-1": "602401143452",
    "eu-south-1": "590381155156", "eu-south-2": "455263428931", "eu-west-1": "602401143452",
    "eu-west-2": "602401143452", "eu-west-3": "602401143452", "il-central-1": "066635153087",
    "me-central-1": "759879836304", "me-south-1": "558608220178", "mx-central-1": "730335286997",
    "sa-east-1": "602401143452",
    "us-east-1": "602401143452", "us-east-2": "602401143452", "us-gov-east-1": "151742754352",
    "us-gov-west-1": "013241004608", "us-west-1": "602401143452", "us-west-2": "602401143452",
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
    node_monitoring_agent: str
    cluster_autoscaler: str


# Standard-support ends: EKS user guide, kubernetes-versions-standard (1.34: 2026-12-02;
# 1.35: 2027-03-27). CoreDNS: the user guide's managing-coredns version table (v1.13.2-eksbuild.4
# for 1.33-1.35). Pod Identity agent: the version EKS resolved on a 1.36 cluster (its versions are
# not per Kubernetes minor). Node monitoring agent: the build of aws/eks-node-monitoring-agent
# v1.7.0 (2026-08-04) that its chart installs, image v1.7.0-eksbuild.1
# (charts/eks-node-monitoring-agent/values.yaml nodeAgent.image.tag), for both minors: its builds
# are not per Kubernetes minor either (the user guide's node-health-nma lists them per cluster
# version with describe-addon-versions). cluster-autoscaler: the newest patch tag of each minor in
# kubernetes/autoscaler (cluster-autoscaler-1.34.5, cluster-autoscaler-1.35.2).
# `aws eks describe-addon-versions --kubernetes-version 1.35 --addon-name coredns` checks a pin
# (`--addon-name eks-node-monitoring-agent` the monitoring agent's).
KUBERNETES_RELEASES: dict[str, KubernetesRelease] = {
    "1.34": KubernetesRelease(date(2026, 12, 2), coredns="v1.13.2-eksbuild.4",
                              pod_identity_agent="v1.3.10-eksbuild.3",
                              node_monitoring_agent="v1.7.0-eksbuild.1",
                              cluster_autoscaler="v1.34.5"),
    "1.35": KubernetesRelease(date(2027, 3, 27), coredns="v1.13.2-eksbuild.4",
                              pod_identity_agent="v1.3.10-eksbuild.3",
                              node_monitoring_agent="v1.7.0-eksbuild.1",
                              cluster_autoscaler="v1.35.2"),
}
# The oldest Pulumi CLI the program runs on. The program asks the engine with the SDK's
# `require_pulumi_version`, which calls the engine RPC RequirePulumiVersion: in
# proto/pulumi/engine.proto from v3.217.0 (pulumi/pulumi#21528; v3.216.0 named it
# CheckPulumiVersion, older CLIs have neither), and the SDK raises on the UNIMPLEMENTED answer of
# any older CLI (pulumi/runtime/settings.py). That RPC sets the floor; `pulumi.Stash` (the zones)
# needs only 3.208.0. No invoke waits on a resource (those after a remote component are gated only
# from 3.256.0, pulumi/pulumi PR #24040), and Pulumi.yaml's object-typed config keys are older.
PULUMI_CLI_MIN = "3.217.0"
KUBERNETES_VERSION = "1.35"  # in EKS standard support; 1.34 bills extended support from 2026-12-02
CLUSTER_AUTOSCALER_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
RAY_IMAGE = "public.ecr.aws/deep-learning-containers/ray:train-ml-cuda-v1.1"
RAY_VERSION = "2.58.0"  # the Ray inside RAY_IMAGE; RayCluster.spec.rayVersion must match
# The MLflow client the job installs at submission (runtime_env pip) when tracking is on: the
# image ships none (aws/deep-learning-containers docker/ray-train/uv.lock, the newest lockfile
# stored, for Ray 2.56 / v1.0, lists no mlflow; v1.1's was not found). The skinny client: the
# full `mlflow` package also pulls a server, scikit-learn and pandas. requirements-dev.txt pins the
# same version for the tests (tests/workloads/test_manifests.py checks they agree).
MLFLOW_CLIENT = "mlflow-skinny==3.17.2"
# PEFT, installed at submission the same way only for LoRA runs (--lora-rank > 0): the image's
# lockfile (the same uv.lock) lists no peft either. requirements-dev.txt pins the same version.
PEFT_CLIENT = "peft==0.21.2"
# lm-evaluation-harness, installed the same way only when --harness-tasks is set (training/evals).
LM_EVAL_CLIENT = "lm-eval==0.4.13"


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
    # Kueue's chart (an OCI artifact, so no repo): its CRDs are templates, so Helm also upgrades
    # them, and `ray.io/rayjob` is among its default integrations (kubernetes-sigs/kueue v0.19.2
    # charts/kueue/templates/crd/, values.yaml managerConfig.integrations.frameworks).
    "kueue": Chart("oci://registry.k8s.io/kueue/charts/kueue", "", "0.19.2", "kueue-system"),
}


# The kinds the KubeRay 1.7.0 operator serves: it always starts the RayCluster, RayService and
# RayJob controllers, and RayCronJob's only behind an alpha feature gate that is off by default
# and in the chart (ray-operator/main.go, pkg/features/features.go, the chart's values.yaml).
KUBERAY_CRD_KINDS = ("RayCluster", "RayJob", "RayService")
# The release's CRD files ({plural} is e.g. rayclusters), as Helm's crds/ directory holds them.
KUBERAY_CRD_URL = ("https://raw.githubusercontent.com/ray-project/kuberay/v{version}/helm-chart/"
                   "kuberay-operator/crds/ray.io_{plural}.yaml")


def kuberay_crd_urls(version: str) -> dict[str, str]:
    """Kind -> URL of its CRD in the pinned KubeRay release, applied by the program itself
    (Helm installs crds/ once and never upgrades them)."""
    return {kind: KUBERAY_CRD_URL.format(version=version, plural=f"{kind.lower()}s")
            for kind in KUBERAY_CRD_KINDS}
