"""The stack config's semantic checks, one function per concern (`validate` runs them all): each
problem names its config key and the fix, and every problem is reported at once. Pure: a
`StackConfig` whose values have the right types in, a list of problems out."""

from __future__ import annotations

import ipaddress
import json
import re
from stack import catalog
from stack.config import StackConfig
from stack.data_access import data_access_problems
from stack.kube import (EKS_NAME_MAX, GPU_SELECTOR, JOB_HASH_LEN, RAYCLUSTER_NAME_MAX,
                        RAYJOB_NAME_MAX, RUN_START_BUDGET_S, SYSTEM_LABELS)
from stack.tracking import tracking_problems

MAX_GPU_NODES = 64
MAX_SYSTEM_NODES = 10
MIN_ROOT_VOLUME_GIB = 200
MIN_JOB_DEADLINE_S = RUN_START_BUDGET_S + 600  # at least 10 minutes of training after the start

_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_IMAGE = re.compile(r"^[\w.\-/:]+(:[\w][\w.\-]{0,127}|@sha256:[0-9a-f]{64})$")
_PRINCIPAL = re.compile(r"^arn:aws:iam::\d{12}:(role|user)/[\w+=,.@/-]+$")  # aws partition
_RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{8,17}$")
_AZ = re.compile(r"^(?P<region>[a-z]{2}(-gov)?-[a-z]+-\d)[a-z]$")
_K8S_VERSION = re.compile(r"^1\.\d{2}$")


def validate(cfg: StackConfig) -> list[str]:
    """Semantic problems: ranges, names, CIDRs, zones, instance facts, reservations."""
    return [*region_and_names(cfg), *network(cfg), *node_groups(cfg), *reservations(cfg),
            *capacity_type(cfg), *job(cfg), *access(cfg), *existing_cluster(cfg),
            *data_access(cfg)]


def region_and_names(cfg: StackConfig) -> list[str]:
    """The Region, the cluster name (and the names derived from it), the Kubernetes version."""
    p: list[str] = []
    if not cfg.region:
        p.append("aws:region: not set; run `pulumi config set aws:region us-west-2`")
    elif cfg.region not in catalog.EKS_ADDON_REGISTRY_ACCOUNTS:
        p.append(f"aws:region: {cfg.region} has no Amazon EKS add-on registry in stack/catalog.py "
                 "EKS_ADDON_REGISTRY_ACCOUNTS (the EFA device plugin's image comes from it); add "
                 "the Region's account from the EKS user guide's add-ons-images page")
    if not _DNS_LABEL.match(cfg.name):
        p.append(f"clusterName: {cfg.name!r} must be lowercase letters, digits and '-', starting "
                 "with a letter (it names Kubernetes objects)")
    limits = (("EKS cluster", EKS_NAME_MAX, 0), ("RayCluster", RAYCLUSTER_NAME_MAX, 0),
              ("RayJob", RAYJOB_NAME_MAX, JOB_HASH_LEN + 1))
    for what, limit, suffix in limits:
        if len(cfg.name) + suffix > limit:
            p.append(f"clusterName: {cfg.name!r} ({len(cfg.name)} characters) is too long for the "
                     f"{what} name (at most {limit}{' including a -hash suffix' if suffix else ''}): "
                     f"use at most {limit - suffix} characters")
    if not _K8S_VERSION.match(cfg.kubernetes_version):
        p.append(f"kubernetesVersion: {cfg.kubernetes_version!r} is not a version like \"1.34\"")
    elif cfg.kubernetes_version not in catalog.KUBERNETES_RELEASES:
        p.append(f"kubernetesVersion: {cfg.kubernetes_version} has no add-on and cluster-autoscaler "
                 f"versions in stack/catalog.py KUBERNETES_RELEASES (known: "
                 f"{', '.join(catalog.KUBERNETES_RELEASES)}); add them or use a known version")
    return p


def network(cfg: StackConfig) -> list[str]:
    """The VPC's CIDR and who reaches the cluster's API endpoint."""
    p = check_cidr("vpcCidr", cfg.vpc_cidr, min_prefix=16, max_prefix=20)
    for cidr in cfg.api_public_cidrs:
        p += check_cidr("apiPublicCidrs", cidr)
    if cfg.api_private_only and cfg.api_public_cidrs != ("0.0.0.0/0",):
        p.append("apiPublicCidrs: set while apiPrivateOnly is true; remove one of them")
    return p


def node_groups(cfg: StackConfig) -> list[str]:
    """The system and GPU groups' instance types, node counts, root volumes and GPU zone."""
    p: list[str] = []
    if cfg.system_instance_type not in catalog.INSTANCES:
        p.append(f"systemInstanceType: unknown {cfg.system_instance_type!r}; known: "
                 f"{', '.join(k for k, v in catalog.INSTANCES.items() if not v.gpus)}")
    gpu_choices = ", ".join(k for k, v in catalog.INSTANCES.items() if v.efa_interfaces)
    facts = catalog.INSTANCES.get(cfg.gpu_instance_type)
    if facts is None:
        p.append(f"gpuInstanceType: unknown {cfg.gpu_instance_type!r}; use one of {gpu_choices} "
                 "(or add it to stack/catalog.py INSTANCES)")
    elif not facts.gpus or not facts.efa_interfaces:
        p.append(f"gpuInstanceType: {cfg.gpu_instance_type!r} has no "
                 f"{'GPU' if not facts.gpus else 'EFA support'}; use one of {gpu_choices}")
    if not 0 <= cfg.gpu_node_count <= MAX_GPU_NODES:
        p.append(f"gpuNodeCount: {cfg.gpu_node_count} is out of range 0..{MAX_GPU_NODES} "
                 "(the GPU nodes of one run; 0 deploys none)")
    if not 1 <= cfg.system_node_count <= MAX_SYSTEM_NODES:
        p.append(f"systemNodeCount: {cfg.system_node_count} is out of range 1..{MAX_SYSTEM_NODES} "
                 "(the KubeRay operator and Ray head need one)")
    if cfg.root_volume_gib < MIN_ROOT_VOLUME_GIB:
        p.append(f"rootVolumeGib: {cfg.root_volume_gib} is below {MIN_ROOT_VOLUME_GIB} (the GPU "
                 "AMI plus the Ray Train image need it)")
    if cfg.gpu_availability_zone:
        m = _AZ.match(cfg.gpu_availability_zone)
        if not m or m["region"] != cfg.region:
            p.append(f"gpuAvailabilityZone: {cfg.gpu_availability_zone!r} is not a zone of "
                     f"{cfg.region} (e.g. {cfg.region}a); leave it unset to pick one that offers "
                     f"{cfg.gpu_instance_type}")
    return p


def reservations(cfg: StackConfig) -> list[str]:
    """A capacity reservation or Capacity Block: one of them, in the GPU zone, of the GPU type,
    with room for the GPU nodes."""
    p: list[str] = []
    if cfg.capacity_reservation and cfg.capacity_block:
        p.append("capacityReservation and capacityBlock: both set; a node group uses one or the "
                 "other, remove one")
    if cfg.reserved and not cfg.gpu_availability_zone:
        p.append("gpuAvailabilityZone: required with a capacityReservation or capacityBlock: the "
                 "reservation lives in one zone and its instances launch only there; set it to "
                 f"that zone (aws ec2 describe-capacity-reservations --capacity-reservation-ids "
                 f"{cfg.reserved.id} --query 'CapacityReservations[0].AvailabilityZone')")
    facts = catalog.INSTANCES.get(cfg.gpu_instance_type)
    if cfg.capacity_block and facts is not None and not facts.capacity_blocks:
        p.append(f"capacityBlock: {cfg.gpu_instance_type} is not known to be sold as EC2 Capacity "
                 f"Blocks (known: {', '.join(k for k, v in catalog.INSTANCES.items() if v.capacity_blocks)}); "
                 "use capacityReservation for an on-demand reservation, or mark the type "
                 "capacity_blocks=True in stack/catalog.py INSTANCES if EC2 now sells it so")
    for key, res in (("capacityReservation", cfg.capacity_reservation),
                     ("capacityBlock", cfg.capacity_block)):
        if res is None:
            continue
        if not _RESERVATION_ID.match(res.id):
            p.append(f"{key}.id: {res.id!r} is not a capacity reservation id (cr-...)")
        if cfg.gpu_node_count > res.instance_count:
            p.append(f"gpuNodeCount: {cfg.gpu_node_count} nodes do not fit {key} {res.id} of "
                     f"{res.instance_count} instances; lower gpuNodeCount or grow the reservation")
    return p


def capacity_type(cfg: StackConfig) -> list[str]:
    """Spot GPU nodes cannot use reserved capacity (gpuCapacityType's spelling itself is read,
    and refused when unknown, as the parser resolves its record: stack/parse.py)."""
    if cfg.spot and cfg.reserved:
        key = "capacityReservation" if cfg.capacity_reservation else "capacityBlock"
        return [f"gpuCapacityType: spot nodes cannot launch into the {key} (it holds on-demand "
                f"capacity of its own); remove {key} or set gpuCapacityType on-demand"]
    return []


def job(cfg: StackConfig) -> list[str]:
    """What the run's pods and job are given: the image, the tracking server and its
    credentials, the deadline."""
    p: list[str] = []
    if not _IMAGE.match(cfg.image):
        p.append(f"image: {cfg.image!r} needs a tag (repo:tag) or a digest (repo@sha256:<64 hex>)")
    p += tracking_problems(cfg.mlflow_tracking_uri, cfg.mlflow_tracking_username,
                           cfg.mlflow_tracking_password_set)
    if cfg.job_deadline_seconds < MIN_JOB_DEADLINE_S:
        p.append(f"jobDeadlineSeconds: {cfg.job_deadline_seconds} is below {MIN_JOB_DEADLINE_S}: "
                 f"the deadline counts from the RayJob's start, so it covers node boot and image "
                 f"pull ({RUN_START_BUDGET_S} s allowed) as well as training")
    return p


def data_access(cfg: StackConfig) -> list[str]:
    """The run reads S3 only where its pods' role may: dataBuckets and the checkpoint bucket."""
    t = cfg.training
    return data_access_problems(cfg.data_buckets, {
        "training.data": t.data, "training.evalData": t.eval_data, "training.model": t.model})


def access(cfg: StackConfig) -> list[str]:
    """Who else gets cluster-admin."""
    if cfg.admin_principal_arn and not _PRINCIPAL.match(cfg.admin_principal_arn):
        return [f"adminPrincipalArn: {cfg.admin_principal_arn!r} is not an IAM role or user ARN "
                "(arn:aws:iam::123456789012:role/NAME)"]
    return []


def existing_cluster(cfg: StackConfig) -> list[str]:
    """The keys that only an existing cluster takes: its name, its own KubeRay, the labels of its
    node groups (this stack's own groups carry stack/kube.py's); and the one it does not: node
    repair is set on node groups, and that cluster's are not this stack's."""
    p: list[str] = []
    if cfg.existing_cluster_name and not _DNS_LABEL.match(cfg.existing_cluster_name.lower()):
        p.append(f"existingClusterName: {cfg.existing_cluster_name!r} is not an EKS cluster name")
    if cfg.existing_cluster_name and not cfg.gpu_node_auto_repair:
        p.append("gpuNodeAutoRepair: false does nothing with existingClusterName (this stack "
                 "declares none of its node groups; set theirs with aws eks "
                 "update-nodegroup-config --node-repair-config enabled=false): remove it")
    if cfg.existing_kuberay and not cfg.existing_cluster_name:
        p.append("existingKuberay: only with existingClusterName; this stack's own cluster gets "
                 "the pinned KubeRay operator: remove existingKuberay")
    if cfg.existing_kueue and not cfg.existing_cluster_name:
        p.append("existingKueue: only with existingClusterName; this stack's own cluster gets "
                 "the pinned Kueue: remove existingKueue")
    if cfg.existing_kueue and not cfg.queue:
        p.append("existingKueue: true queues the runs in the cluster's Kueue, queue: false "
                 "queues none: remove one")
    for key, selector, default in (
            ("systemNodeSelector", cfg.system_node_selector, SYSTEM_LABELS),
            ("gpuNodeSelector", cfg.gpu_node_selector, GPU_SELECTOR)):
        if not (isinstance(selector, dict) and selector
                and all(isinstance(v, str) for v in selector.values())):
            p.append(f"{key}: expected a non-empty mapping of label to value, e.g. "
                     f"{json.dumps(default)}")
        elif selector != default and not cfg.existing_cluster_name:
            p.append(f"{key}: only with existingClusterName; this stack's own node groups carry "
                     f"{json.dumps(default)}: remove {key}")
    return p


def check_cidr(key: str, value: str, min_prefix: int = 0, max_prefix: int = 32) -> list[str]:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        return [f"{key}: {value!r} is not a valid IPv4 CIDR ({e})"]
    if net.version != 4 or not min_prefix <= net.prefixlen <= max_prefix:
        return [f"{key}: {value!r} must be an IPv4 network between /{min_prefix} and /{max_prefix}"]
    return []
