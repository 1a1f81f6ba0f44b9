"""The stack config from the raw Pulumi config: `parse`, pure (a mapping of raw config strings in,
`StackConfig` out), collects every problem, each naming its config key and the fix, so `pulumi up`
fails once with the whole list instead of one problem per attempt (the semantic checks, by
concern, are stack/validation.py). `stack.pulumi_config.load` feeds it under `pulumi up`.

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
import json
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from stack import catalog
from stack.config import ConfigError, Reservation, StackConfig
from stack.kube import GPU_SELECTOR, SYSTEM_LABELS
from stack.validation import MAX_GPU_NODES, validate
from training.config import TrainConfig
from training.errors import ConfigError as JobConfigError
from training.settings import closest, from_settings

PULUMI_YAML = Path(__file__).resolve().parent.parent / "Pulumi.yaml"

# The job's settings on the cluster, under the stack's `training` object: what a stack trains
# unless it says otherwise (the job's own defaults, in TrainConfig, are a laptop's).
JOB_DEFAULTS: dict[str, Any] = {
    "model": "Qwen/Qwen2.5-1.5B", "steps": 100, "seqLen": 2048, "checkpointEvery": 50,
    # Full fine-tuning: TRL's SFT default (trl/trainer/sft_config.py, SFTConfig.learning_rate
    # = 2e-5, "instead of 5e-5"), not the 1e-4 of a from-scratch run.
    "lr": 2e-5,
    # Network-bound on 2 x g6.12xlarge (one 40 Gbps EFA link): gradients reduced once per
    # optimizer step, in bf16 (bench/NOTES.md: +27% on the sockets proxy, loss within 0.004%).
    "reduceDtype": "bf16",
    "maxFailures": 2,  # a lost worker (node, spot, NCCL timeout) restarts from the last checkpoint
    "export": True,  # the fine-tuned model, as a Hugging Face directory in the bucket
    # Packed rows keep documents apart; flex_attention's block-sparse mask costs less than sdpa's
    # dense one with the job's compiled layers (H200, 4 documents per row: bench/runs/2026-12-01/
    # i19-docmask.json, bench/NOTES.md). sdpa stays the laptop default: flex has no CPU backward.
    "attention": "flex_attention",
}
# A real fine-tune unless the stack sets `data`: trl-lib/Capybara from the Hugging Face Hub (the
# set TRL's own SFT examples train on; `messages` chats; its card: train 15,806 conversations,
# 71,908,734 bytes, test 200), about 18-21 M tokens with Qwen2.5's tokenizer, so the default 100
# steps of 262,144 tokens are 1.3-1.5 epochs (the job logs the exact count), evaluated on its test
# split every 25 steps. The driver downloads it (the pods reach the Hub through the NAT gateway).
# A stack's own `data` comes without these evaluation settings (`random`, for transport checks,
# has nothing to hold out); a stack's `epochs` replaces the default `steps`.
DEFAULT_DATA: dict[str, Any] = {"data": "hf://trl-lib/Capybara",
                                "evalData": "hf://trl-lib/Capybara:test", "evalEvery": 25}
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
    "efa_floor_gbps": "the floor of gpuInstanceType in stack/catalog.py (multi-node runs)",
    "strict_efa": "set strictEfa",
    "mlflow_tracking_uri": "set the stack key mlflowTrackingUri (the job installs the MLflow "
                           "client only then)",
}




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
    "gpuCapacityType": (_str, "gpu_capacity"),  # a name until _capacity resolves it
    "capacityReservation": (_json, "capacity_reservation"),
    "capacityBlock": (_json, "capacity_block"),
    "image": (_str, "image"),
    "rayVersion": (_str, "ray_version"),
    "tags": (_json, "tags"),
    "adminPrincipalArn": (_str, "admin_principal_arn"),
    "apiPublicCidrs": (_json, "api_public_cidrs"),
    "apiPrivateOnly": (_bool, "api_private_only"),
    "rootVolumeGib": (_int, "root_volume_gib"),
    "gpuNodeAutoRepair": (_bool, "gpu_node_auto_repair"),
    "existingClusterName": (_str, "existing_cluster_name"),
    "existingKuberay": (_bool, "existing_kuberay"),
    "existingKueue": (_bool, "existing_kueue"),
    "systemNodeSelector": (_json, "system_node_selector"),
    "gpuNodeSelector": (_json, "gpu_node_selector"),
    "runJob": (_bool, "run_job"),
    "queue": (_bool, "queue"),
    "strictEfa": (_bool, "strict_efa"),
    "forceDestroyBucket": (_bool, "force_destroy_bucket"),
    "dataBuckets": (_json, "data_buckets"),
    "training": (_json, "training"),
    "mlflowTrackingUri": (_str, "mlflow_tracking_uri"),
    "mlflowTrackingUsername": (_str, "mlflow_tracking_username"),
    "extraPip": (_json, "extra_pip"),
    "jobDeadlineSeconds": (_int, "job_deadline_seconds"),
    "ecrPullThroughCache": (_bool, "ecr_pull_through_cache"),
    "endOnScaleUpFailure": (_bool, "end_on_scale_up_failure"),
}
# Read by the program as secret Outputs (stack.pulumi_config.secret), never into StackConfig.
SECRET_KEYS = ("hfToken", "mlflowTrackingPassword")
# Empty ("" or {}) in Pulumi.yaml: the pinned value from the catalog, or this stack's own labels.
PINNED = {"kubernetesVersion": catalog.KUBERNETES_VERSION, "image": catalog.RAY_IMAGE,
          "rayVersion": catalog.RAY_VERSION, "systemNodeSelector": SYSTEM_LABELS,
          "gpuNodeSelector": GPU_SELECTOR}
# Empty ("" or {}) in Pulumi.yaml: unset.
OPTIONAL = ("gpuAvailabilityZone", "capacityReservation", "capacityBlock", "adminPrincipalArn",
            "existingClusterName", "mlflowTrackingUri", "mlflowTrackingUsername")


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
    unknown = _capacity(values)
    values["training"] = _training(values.get("training") or {}, _workers(values), problems)
    for key, attr, example in (("apiPublicCidrs", "api_public_cidrs", '["203.0.113.0/24"]'),
                               ("extraPip", "extra_pip", '["datasets==4.4.1"]'),
                               ("dataBuckets", "data_buckets", '["s3://my-bucket/chats/"]')):
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
    values["mlflow_tracking_password_set"] = bool(merged.get("mlflowTrackingPassword"))
    cfg = StackConfig(**values)
    problems = [*unknown, *validate(cfg)]
    if problems:
        raise ConfigError(problems)
    return cfg


def _capacity(values: dict) -> list[str]:
    """gpuCapacityType's name made its catalog record, once for every reader: CAPACITY_BLOCK
    where on-demand nodes launch into a capacityBlock. An unknown name is a semantic problem,
    reported with the others (validate), its record on-demand meanwhile."""
    name = values.get("gpu_capacity")
    capacity = catalog.CAPACITY_TYPES.get(name, catalog.ON_DEMAND)
    if capacity is catalog.ON_DEMAND and values.get("capacity_block") is not None:
        capacity = catalog.CAPACITY_BLOCK
    values["gpu_capacity"] = capacity
    if name is None or name in catalog.CAPACITY_TYPES:
        return []  # None: already reported as missing or empty
    known = list(catalog.CAPACITY_TYPES)
    return [f"gpuCapacityType: unknown {name!r}{closest(name, known)}; use one of "
            f"{', '.join(known)}"]


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
    defaults = {k: v for k, v in JOB_DEFAULTS.items() if not (k == "steps" and "epochs" in value)}
    settings = {**defaults, **({} if "data" in value else DEFAULT_DATA), **value}
    if workers and not any(k in value for k in BATCH_KEYS) and isinstance(settings["seqLen"], int):
        settings["tokensPerStep"] = SEQUENCES_PER_GPU_PER_STEP * settings["seqLen"] * workers
    try:
        return from_settings(settings, prefix="training.",
                             owned_elsewhere=SET_BY_THE_STACK,
                             fixed={"num_workers": workers} if workers else None)
    except JobConfigError as e:
        problems.extend(e.problems)
        return None
