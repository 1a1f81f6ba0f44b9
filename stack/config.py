"""The stack's one typed configuration, validated once before any resource is declared.

`parse` is pure (a mapping of raw config strings in, `StackConfig` out) and collects every problem,
each naming its config key and the fix, so `pulumi up` fails once with the whole list instead of
one problem per attempt. `stack.pulumi_config.load` feeds it under `pulumi up`.

The stack's defaults live in one place, the `config:` block of Pulumi.yaml: the Pulumi CLI merges
them into every stack before the program runs (pulumi/pulumi pkg/workspace/config.go,
mergeConfig), and `parse` merges the same file the same way, so tests and deployments read one
copy. An empty value there means "the pinned value from stack/catalog.py" (image, versions) or
"unset". The `training` object holds the job's own settings, its keys the training CLI's flags in
camelCase, validated by the job's own config class (training/config.py); what a stack leaves out
takes JOB_DEFAULTS below (only where the cluster wants other values than a laptop's), then the
job's own defaults (TrainConfig).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from stack import catalog
from stack.kube import (EKS_NAME_MAX, GPU_LABELS, JOB_HASH_LEN, NAMESPACE, RAYCLUSTER_NAME_MAX,
                        RAYJOB_NAME_MAX, RUN_START_BUDGET_S, SYSTEM_LABELS)
from training.config import ConfigError as JobConfigError
from training.config import InputError, TrainConfig, closest, from_settings

PULUMI_YAML = Path(__file__).resolve().parent.parent / "Pulumi.yaml"
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

# The job's settings on the cluster, under the stack's `training` object: what a stack trains
# unless it says otherwise (the job's own defaults, in TrainConfig, are a laptop's).
JOB_DEFAULTS: dict[str, Any] = {
    "model": "Qwen/Qwen2.5-1.5B", "steps": 100, "seqLen": 2048, "lr": 1e-4, "checkpointEvery": 50,
    # Network-bound on 2 x g6.12xlarge (one 40 Gbps EFA link): gradients reduced once per
    # optimizer step, in bf16 (bench/NOTES.md: +27% on the sockets proxy, loss within 0.004%).
    "reduceDtype": "bf16",
    "maxFailures": 2,  # a lost worker (node, spot, NCCL timeout) restarts from the last checkpoint
    "export": True,  # the fine-tuned model, as a Hugging Face directory in the bucket
}
# Unless a stack sets its batch (tokensPerStep, microBatchSize or gradAccum), an optimizer step
# takes this many sequences per GPU (262,144 tokens on 8 GPUs at 2,048): a large global batch
# that the job's planner splits into micro-batches that fit the GPU, so the one EFA link carries
# one gradient reduction per 16 sequences (bench/MODEL.md: 5.2x the reference predicted on
# 2 x g6.12xlarge; the levers measured 3.8-4.9x on the sockets proxy).
SEQUENCES_PER_GPU_PER_STEP = 16
BATCH_KEYS = ("tokensPerStep", "microBatchSize", "gradAccum")
# Job settings the RayJob builder sets from the stack, never the `training` object.
SET_BY_THE_STACK = {
    "num_workers": "the stack runs one worker per GPU (gpuNodeCount x the GPUs of gpuInstanceType)",
    "use_gpu": "workers always use their GPU on the cluster",
    "storage_path": "checkpoints go to the stack's bucket (output checkpointStorage)",
    "name": "the run name follows clusterName, model, data and sequence length",
    "expect_transport": "set strictEfa; multi-node runs always expect EFA",
    "address": "the job joins its own Ray cluster",
    "mlflow_tracking_uri": "set the stack key mlflowTrackingUri (the job installs the MLflow "
                           "client only then)",
}


class ConfigError(InputError):
    """Every problem with the stack config, each naming its key and the fix."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack configuration:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclass(frozen=True)
class Reservation:
    """A capacity reservation or Capacity Block: its id and how many instances it holds."""

    id: str
    instance_count: int


@dataclass(frozen=True)
class StackConfig:
    """The validated stack. No defaults here: they come from Pulumi.yaml (see the module doc)."""

    name: str
    region: str
    kubernetes_version: str
    vpc_cidr: str
    system_instance_type: str
    system_node_count: int
    gpu_instance_type: str
    gpu_node_count: int
    gpu_availability_zone: str | None
    capacity_reservation: Reservation | None
    capacity_block: Reservation | None
    image: str
    ray_version: str
    tags: Mapping[str, str]
    admin_principal_arn: str | None
    api_public_cidrs: tuple[str, ...]
    api_private_only: bool
    root_volume_gib: int
    existing_cluster_name: str | None
    existing_kuberay: bool  # the existing cluster runs its own KubeRay operator
    # Where the pods go: this stack's own node groups carry the defaults (stack/kube.py); on an
    # existing cluster, the labels its node groups carry.
    system_node_selector: Mapping[str, str]
    gpu_node_selector: Mapping[str, str]
    run_job: bool
    strict_efa: bool
    force_destroy_bucket: bool
    training: TrainConfig
    mlflow_tracking_uri: str | None  # http(s):// of a tracking server the pods can reach
    extra_pip: tuple[str, ...]
    job_deadline_seconds: int
    ecr_pull_through_cache: bool
    end_on_scale_up_failure: bool

    @property
    def gpu(self) -> catalog.InstanceFacts:
        return catalog.INSTANCES[self.gpu_instance_type]

    @property
    def system(self) -> catalog.InstanceFacts:
        return catalog.INSTANCES[self.system_instance_type]

    @property
    def num_workers(self) -> int:
        return self.gpu_node_count * self.gpu.gpus

    @property
    def namespace(self) -> str:
        """The Ray workloads' namespace (their service account's Pod Identity association names
        it): `ray` on the stack's own cluster; on an existing one `ray-<clusterName>`, so that it
        collides neither with what is there nor with another stack on the same cluster."""
        return f"{NAMESPACE}-{self.name}" if self.existing_cluster_name else NAMESPACE

    @property
    def caches_images(self) -> bool:
        """ECR Public images come through this stack's pull-through cache: only on a cluster of
        its own, whose node roles the stack can allow the cache's first pull."""
        return self.ecr_pull_through_cache and self.existing_cluster_name is None

    @property
    def reserved(self) -> Reservation | None:
        """The reservation the GPU nodes launch into, of either kind."""
        return self.capacity_reservation or self.capacity_block


# key -> (parser, attribute). Parsers turn a raw config string into a value or raise ValueError.
def _int(raw: str) -> int:
    return int(raw)


def _bool(raw: str) -> bool:
    if str(raw).lower() not in ("true", "false"):
        raise ValueError("expected true or false")
    return str(raw).lower() == "true"


def _json(raw: str) -> Any:
    return json.loads(raw) if isinstance(raw, str) else raw


def _str(raw: str) -> str:
    return str(raw)


FIELDS: dict[str, tuple[Callable[[str], Any], str]] = {
    "clusterName": (_str, "name"),
    "kubernetesVersion": (_str, "kubernetes_version"),
    "vpcCidr": (_str, "vpc_cidr"),
    "systemInstanceType": (_str, "system_instance_type"),
    "systemNodeCount": (_int, "system_node_count"),
    "gpuInstanceType": (_str, "gpu_instance_type"),
    "gpuNodeCount": (_int, "gpu_node_count"),
    "gpuAvailabilityZone": (_str, "gpu_availability_zone"),
    "capacityReservation": (_json, "capacity_reservation"),
    "capacityBlock": (_json, "capacity_block"),
    "image": (_str, "image"),
    "rayVersion": (_str, "ray_version"),
    "tags": (_json, "tags"),
    "adminPrincipalArn": (_str, "admin_principal_arn"),
    "apiPublicCidrs": (_json, "api_public_cidrs"),
    "apiPrivateOnly": (_bool, "api_private_only"),
    "rootVolumeGib": (_int, "root_volume_gib"),
    "existingClusterName": (_str, "existing_cluster_name"),
    "existingKuberay": (_bool, "existing_kuberay"),
    "systemNodeSelector": (_json, "system_node_selector"),
    "gpuNodeSelector": (_json, "gpu_node_selector"),
    "runJob": (_bool, "run_job"),
    "strictEfa": (_bool, "strict_efa"),
    "forceDestroyBucket": (_bool, "force_destroy_bucket"),
    "training": (_json, "training"),
    "mlflowTrackingUri": (_str, "mlflow_tracking_uri"),
    "extraPip": (_json, "extra_pip"),
    "jobDeadlineSeconds": (_int, "job_deadline_seconds"),
    "ecrPullThroughCache": (_bool, "ecr_pull_through_cache"),
    "endOnScaleUpFailure": (_bool, "end_on_scale_up_failure"),
}
SECRET_KEYS = ("hfToken",)  # read by the program as a secret Output, never into StackConfig
# Empty ("" or {}) in Pulumi.yaml: the pinned value from the catalog, or this stack's own labels.
PINNED = {"kubernetesVersion": catalog.KUBERNETES_VERSION, "image": catalog.RAY_IMAGE,
          "rayVersion": catalog.RAY_VERSION, "systemNodeSelector": SYSTEM_LABELS,
          "gpuNodeSelector": {"role": GPU_LABELS["role"]}}
# Empty ("" or {}) in Pulumi.yaml: unset.
OPTIONAL = ("gpuAvailabilityZone", "capacityReservation", "capacityBlock", "adminPrincipalArn",
            "existingClusterName", "mlflowTrackingUri")


def as_config_string(value: Any) -> str:
    """A YAML value as Pulumi hands it to the program: objects and arrays as JSON, booleans
    lowercase, everything else as its text (pkg/workspace/config.go, createConfigValue)."""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


@functools.cache
def declared() -> dict[str, str]:
    """Pulumi.yaml's declared keys and their defaults, as the program receives them."""
    config = yaml.safe_load(PULUMI_YAML.read_text())["config"]
    return {key: as_config_string(spec["default"]) for key, spec in config.items()}


def parse(raw: Mapping[str, Any], region: str, default_name: str = "ray-train") -> StackConfig:
    """Typed, validated config from raw values (strings as Pulumi stores them, Pulumi.yaml's
    defaults merged under them as the CLI does); raises ConfigError."""
    problems: list[str] = []
    known = [*FIELDS, *SECRET_KEYS]
    for key in raw:
        if key not in known:
            problems.append(f"{key}: unknown key{closest(key, known)}; known keys are "
                            f"{', '.join(sorted(known))}")
    merged = {**declared(), **raw}
    values: dict[str, Any] = {"region": region}
    for key, (parse_value, attr) in FIELDS.items():
        text = merged.get(key)
        if text in ("", None) or (text == "{}" and key in (*OPTIONAL, *PINNED)):
            values[attr] = PINNED.get(key, default_name if key == "clusterName" else None)
            if text is None:
                problems.append(f"{key}: no value and no default; declare one in Pulumi.yaml")
            elif key not in (*PINNED, *OPTIONAL, "clusterName"):
                problems.append(f"{key}: empty; set a value (Pulumi.yaml has the default)")
            continue
        try:
            values[attr] = parse_value(text)
        except (ValueError, TypeError) as e:
            problems.append(f"{key}: cannot read {text!r} ({e})")
    for key, attr in (("capacityReservation", "capacity_reservation"),
                      ("capacityBlock", "capacity_block")):
        if values.get(attr) is not None:
            values[attr] = _reservation(key, values[attr], problems)
    values["training"] = _training(values.get("training") or {}, _workers(values), problems)
    for key, attr, example in (("apiPublicCidrs", "api_public_cidrs", '["203.0.113.0/24"]'),
                               ("extraPip", "extra_pip", '["datasets==4.4.1"]')):
        value = values.get(attr)
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            problems.append(f"{key}: expected a list of strings, e.g. {example}")
        values[attr] = tuple(value) if isinstance(value, list) else ()
    if not (isinstance(values.get("tags"), dict)
            and all(isinstance(v, str) for v in values["tags"].values())):
        problems.append("tags: expected a mapping of strings, e.g. {\"team\": \"ml\"}")
        values["tags"] = {}
    if problems:  # types are wrong: semantic checks would only repeat them
        raise ConfigError(problems)
    cfg = StackConfig(**values)
    problems = validate(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def _reservation(key: str, value: Any, problems: list[str]) -> Reservation | None:
    if not isinstance(value, dict) or set(value) != {"id", "instanceCount"}:
        problems.append(f"{key}: expected {{\"id\": \"cr-...\", \"instanceCount\": N}}")
        return None
    count = value["instanceCount"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        problems.append(f"{key}.instanceCount: expected a whole number of at least 1, got {count!r}")
        return None
    return Reservation(id=str(value["id"]), instance_count=count)


def _workers(values: dict) -> int | None:
    """The run's worker count (one per GPU), when the GPU keys are readable."""
    facts = catalog.INSTANCES.get(values.get("gpu_instance_type"))
    count = values.get("gpu_node_count")
    in_range = isinstance(count, int) and 0 < count <= MAX_GPU_NODES
    return count * facts.gpus if facts and in_range else None


def _training(value: Any, workers: int | None, problems: list[str]) -> TrainConfig | None:
    """The job's settings: JOB_DEFAULTS (and the default batch) under the stack's own, checked by
    TrainConfig itself with the run's worker count (tokensPerStep's divisibility depends on it)."""
    if not isinstance(value, dict):
        problems.append("training: expected an object of the job's settings, e.g. {\"steps\": 100}")
        return None
    settings = {**JOB_DEFAULTS, **value}
    if workers and not any(k in value for k in BATCH_KEYS) and isinstance(settings["seqLen"], int):
        settings["tokensPerStep"] = SEQUENCES_PER_GPU_PER_STEP * settings["seqLen"] * workers
    try:
        return from_settings(settings, prefix="training.",
                             owned_elsewhere=SET_BY_THE_STACK,
                             fixed={"num_workers": workers} if workers else None)
    except JobConfigError as e:
        problems.extend(e.problems)
        return None


def validate(cfg: StackConfig) -> list[str]:
    """Semantic problems: ranges, names, CIDRs, zones, instance facts, reservations."""
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
    p += _check_cidr("vpcCidr", cfg.vpc_cidr, min_prefix=16, max_prefix=20)
    for cidr in cfg.api_public_cidrs:
        p += _check_cidr("apiPublicCidrs", cidr)
    if cfg.api_private_only and cfg.api_public_cidrs != ("0.0.0.0/0",):
        p.append("apiPublicCidrs: set while apiPrivateOnly is true; remove one of them")
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
    if cfg.capacity_reservation and cfg.capacity_block:
        p.append("capacityReservation and capacityBlock: both set; a node group uses one or the "
                 "other, remove one")
    if cfg.reserved and not cfg.gpu_availability_zone:
        p.append("gpuAvailabilityZone: required with a capacityReservation or capacityBlock: the "
                 "reservation lives in one zone and its instances launch only there; set it to "
                 f"that zone (aws ec2 describe-capacity-reservations --capacity-reservation-ids "
                 f"{cfg.reserved.id} --query 'CapacityReservations[0].AvailabilityZone')")
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
    if not _IMAGE.match(cfg.image):
        p.append(f"image: {cfg.image!r} needs a tag (repo:tag) or a digest (repo@sha256:<64 hex>)")
    if cfg.admin_principal_arn and not _PRINCIPAL.match(cfg.admin_principal_arn):
        p.append(f"adminPrincipalArn: {cfg.admin_principal_arn!r} is not an IAM role or user ARN "
                 "(arn:aws:iam::123456789012:role/NAME)")
    if cfg.existing_cluster_name and not _DNS_LABEL.match(cfg.existing_cluster_name.lower()):
        p.append(f"existingClusterName: {cfg.existing_cluster_name!r} is not an EKS cluster name")
    if cfg.mlflow_tracking_uri:  # the job's own check, under the stack's key
        p += [f"mlflowTrackingUri: {why.split(' ', 1)[1]}" for why in TrainConfig(
            mlflow_tracking_uri=cfg.mlflow_tracking_uri).problems()]
    if cfg.existing_kuberay and not cfg.existing_cluster_name:
        p.append("existingKuberay: only with existingClusterName; this stack's own cluster gets "
                 "the pinned KubeRay operator: remove existingKuberay")
    if cfg.job_deadline_seconds < MIN_JOB_DEADLINE_S:
        p.append(f"jobDeadlineSeconds: {cfg.job_deadline_seconds} is below {MIN_JOB_DEADLINE_S}: "
                 f"the deadline counts from the RayJob's start, so it covers node boot and image "
                 f"pull ({RUN_START_BUDGET_S} s allowed) as well as training")
    for key, selector, default in (
            ("systemNodeSelector", cfg.system_node_selector, PINNED["systemNodeSelector"]),
            ("gpuNodeSelector", cfg.gpu_node_selector, PINNED["gpuNodeSelector"])):
        if not (isinstance(selector, dict) and selector
                and all(isinstance(v, str) for v in selector.values())):
            p.append(f"{key}: expected a non-empty mapping of label to value, e.g. "
                     f"{json.dumps(default)}")
        elif selector != default and not cfg.existing_cluster_name:
            p.append(f"{key}: only with existingClusterName; this stack's own node groups carry "
                     f"{json.dumps(default)}: remove {key}")
    return p


def _check_cidr(key: str, value: str, min_prefix: int = 0, max_prefix: int = 32) -> list[str]:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as e:
        return [f"{key}: {value!r} is not a valid IPv4 CIDR ({e})"]
    if net.version != 4 or not min_prefix <= net.prefixlen <= max_prefix:
        return [f"{key}: {value!r} must be an IPv4 network between /{min_prefix} and /{max_prefix}"]
    return []
