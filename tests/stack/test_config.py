"""Stack config: every committed stack file is valid; each bad input is rejected by key."""

from __future__ import annotations

import json
from datetime import date

import pytest

from stack.config import ConfigError
from stack.parse import parse
from training.config import TrainConfig
from tests.stack.stacks import STACK_FILES, raw_config, stack_name


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
def test_committed_stack_file_is_a_valid_config(path):
    raw, region = raw_config(path)
    cfg = parse(raw, region)
    assert cfg.region == region and cfg.gpu.gpus == 4 and cfg.gpu.efa_interfaces == 1


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
def test_no_committed_stack_deletes_what_runs_produced_on_destroy(path):
    """The README's flow is train, then destroy: the exported models must outlive it."""
    assert parse(*raw_config(path)).force_destroy_bucket is False


def test_at_least_two_regions_are_committed():
    regions = {raw_config(p)[1] for p in STACK_FILES}
    assert {"us-west-2", "us-east-1"} <= regions


def test_defaults_match_the_reference_deployment():
    cfg = parse({}, "us-west-2")
    assert (cfg.system_instance_type, cfg.system_node_count) == ("m7i.xlarge", 1)
    assert (cfg.gpu_instance_type, cfg.gpu_node_count) == ("g6.12xlarge", 2)
    assert cfg.num_workers == 8 and cfg.api_public_cidrs == ("0.0.0.0/0",)


def problems(raw: dict, region: str = "us-west-2") -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse(raw, region)
    return e.value.problems


@pytest.mark.parametrize("raw, key, fix", [
    ({"gpuInstanceType": "g9.huge"}, "gpuInstanceType", "use one of"),
    ({"gpuInstanceType": "g5.2xlarge"}, "gpuInstanceType", "no EFA support"),
    ({"gpuInstanceType": "m7i.xlarge"}, "gpuInstanceType", "no GPU"),
    ({"gpuNodeCount": "-1"}, "gpuNodeCount", "out of range 0..64"),
    ({"gpuNodeCount": "65"}, "gpuNodeCount", "out of range 0..64"),
    ({"systemNodeCount": "0"}, "systemNodeCount", "out of range 1..10"),
    ({"gpuNodeCount": "two"}, "gpuNodeCount", "cannot read"),
    ({"vpcCidr": "10.0.0.0/33"}, "vpcCidr", "not a valid IPv4 CIDR"),
    ({"vpcCidr": "10.0.0.1/16"}, "vpcCidr", "not a valid IPv4 CIDR"),
    ({"apiPublicCidrs": json.dumps(["203.0.113.0/24", "nope"])}, "apiPublicCidrs", "not a valid"),
    ({"gpuAvailabilityZone": "us-east-1a"}, "gpuAvailabilityZone", "not a zone of us-west-2"),
    ({"clusterName": "a" * 101}, "clusterName", "EKS cluster name"),
    ({"clusterName": "a" * 54}, "clusterName", "RayCluster name"),
    ({"clusterName": "a" * 37}, "clusterName", "RayJob name"),
    ({"clusterName": "Ray_Train"}, "clusterName", "lowercase"),
    ({"capacityReservation": json.dumps({"id": "cr-0123456789abcdef0", "instanceCount": 2}),
      "capacityBlock": json.dumps({"id": "cr-0fedcba9876543210", "instanceCount": 2})},
     "capacityReservation and capacityBlock", "remove one"),
    ({"capacityReservation": json.dumps({"id": "cr-0123456789abcdef0", "instanceCount": 1})},
     "gpuNodeCount", "do not fit capacityReservation"),
    # A reservation lives in one zone: its instances cannot launch in the zone we would pick.
    ({"capacityReservation": json.dumps({"id": "cr-0123456789abcdef0", "instanceCount": 2})},
     "gpuAvailabilityZone", "required with a capacityReservation or capacityBlock"),
    ({"capacityBlock": json.dumps({"id": "cr-0123456789abcdef0", "instanceCount": 2}),
      "gpuAvailabilityZone": "us-west-2b"}, "capacityBlock",
     "g6.12xlarge is not known to be sold as EC2 Capacity Blocks (known: p5.48xlarge)"),
    ({"gpuNodeSelector": json.dumps({"pool": "gpu"})}, "gpuNodeSelector", "only with existingClusterName"),
    ({"systemNodeSelector": json.dumps({"pool": 1}), "existingClusterName": "shared"},
     "systemNodeSelector", "expected a non-empty mapping"),
    ({"existingKuberay": "true"}, "existingKuberay", "only with existingClusterName"),
    ({"existingKueue": "true"}, "existingKueue", "only with existingClusterName"),
    ({"existingKueue": "true", "existingClusterName": "shared", "queue": "false"},
     "existingKueue", "queue: false queues none"),
    ({"kubernetesVersion": "1.29"}, "kubernetesVersion", "KUBERNETES_RELEASES (known: 1.34, 1.35)"),
    ({"capacityBlock": json.dumps({"id": "cr-0123456789abcdef0"})}, "capacityBlock", "instanceCount"),
    ({"image": "public.ecr.aws/x/ray"}, "image", "needs a tag"),
    ({"adminPrincipalArn": "arn:aws:iam::12:role/x"}, "adminPrincipalArn", "not an IAM role"),
    ({"rootVolumeGib": "100"}, "rootVolumeGib", "below 200"),
    ({"training": json.dumps({"steps": 0, "lr": -1})}, "training.steps", "at least 1"),
    ({"training": json.dumps({"stpes": 10})}, "training.stpes", "unknown key"),
    ({"gpuNodes": "2"}, "gpuNodes", "unknown key"),
    ({"capacityReservation": json.dumps({"id": "cr-0123456789abcdef0", "instanceCount": "two"})},
     "capacityReservation.instanceCount", "whole number"),
    ({"capacityBlock": json.dumps({"id": "cr-0123456789abcdef0", "instanceCount": 2.7})},
     "capacityBlock.instanceCount", "whole number"),
    ({"capacityBlock": json.dumps({"id": "cr-0123456789abcdef0", "instanceCount": None})},
     "capacityBlock.instanceCount", "whole number"),
    ({"jobDeadlineSeconds": "600"}, "jobDeadlineSeconds", "covers node boot and image pull"),
    ({"endOnScaleUpFailure": "sometimes"}, "endOnScaleUpFailure", "true or false"),
    ({"vpcCidr": ""}, "vpcCidr", "empty; set a value"),
    ({"training": json.dumps({"lr": "fast"})}, "training.lr", "expected float"),
    ({"mlflowTrackingUri": "ftp://mlflow.internal"}, "mlflowTrackingUri", "http:// or https://"),
    ({"mlflowTrackingUri": "https://alice:s3cret@mlflow.example.com"}, "mlflowTrackingUri",
     "holds credentials (user:password@)"),
    ({"mlflowTrackingUsername": "alice", "mlflowTrackingPassword": "s3cret"},
     "mlflowTrackingUsername / mlflowTrackingPassword", "set without mlflowTrackingUri"),
    ({"mlflowTrackingUri": "https://mlflow.example.com", "mlflowTrackingUsername": "alice"},
     "mlflowTrackingPassword", "required with mlflowTrackingUsername"),
    ({"mlflowTrackingUri": "https://mlflow.example.com", "mlflowTrackingPassword": "s3cret"},
     "mlflowTrackingUsername", "required with mlflowTrackingPassword"),
])
def test_bad_input_is_rejected_naming_its_key_and_fix(raw, key, fix):
    found = problems(raw)
    assert any(p.startswith(key) and fix in p for p in found), found


def test_every_problem_is_reported_at_once():
    found = problems({"gpuNodeCount": "99", "vpcCidr": "300.0.0.0/16",
                      "gpuAvailabilityZone": "eu-west-1a", "clusterName": "x" * 60})
    for key in ("gpuNodeCount", "vpcCidr", "gpuAvailabilityZone", "clusterName"):
        assert any(p.startswith(key) for p in found), (key, found)


def test_default_kubernetes_version_is_in_standard_support_for_months():
    from stack.catalog import KUBERNETES_RELEASES

    version = parse({}, "us-west-2").kubernetes_version
    assert KUBERNETES_RELEASES[version].standard_support_end >= date(2027, 3, 1)


def test_gpu_family_is_a_config_change():
    cfg = parse({"gpuInstanceType": "p5.48xlarge", "gpuNodeCount": "2"}, "us-east-1")
    assert cfg.gpu.gpus == 8 and cfg.gpu.efa_interfaces == 32 and cfg.num_workers == 16


def test_declared_keys_are_exactly_the_keys_the_program_reads():
    import yaml

    from stack.parse import FIELDS, PULUMI_YAML, SECRET_KEYS

    declared = set(yaml.safe_load(PULUMI_YAML.read_text())["config"])
    assert declared == set(FIELDS) | set(SECRET_KEYS)


def test_every_declared_key_has_a_default_so_a_new_stack_needs_no_config():
    """Pulumi requires a value for a declared key without a default (pkg/workspace/config.go)."""
    import yaml

    from stack.parse import PULUMI_YAML

    config = yaml.safe_load(PULUMI_YAML.read_text())["config"]
    assert all("default" in spec for spec in config.values())
    cfg = parse({}, "us-west-2", default_name="eks-ray-train-new")
    assert cfg.name == "eks-ray-train-new" and cfg.training.max_failures == 2


def test_no_declared_key_is_a_secret_with_a_default():
    """The CLI merges a declared default into the stack as a plaintext value, then refuses a
    typed `secret: true` key whose value is not encrypted (pkg/workspace/config.go, mergeConfig,
    validateStackConfigValue): every stack without a value of its own would fail. The program
    refuses a plaintext hfToken itself (stack/pulumi_config.py)."""
    import yaml

    from stack.parse import PULUMI_YAML

    config = yaml.safe_load(PULUMI_YAML.read_text())["config"]
    assert not [k for k, spec in config.items() if spec.get("secret") and "default" in spec]


@pytest.mark.parametrize("raw, message", [
    ({"gpuNodes": "3"}, "gpuNodes: unknown key; did you mean gpuNodeCount?"),
    ({"training": json.dumps({"stpes": 10})}, "training.stpes: unknown key; did you mean training.steps?"),
    ({"training": json.dumps({"maxFailure": 1})}, "did you mean training.maxFailures?"),
    ({"training": json.dumps({"numWorkers": 4})}, "training.numWorkers: not a setting here"),
    ({"training": json.dumps({"storagePath": "/tmp"})}, "training.storagePath: not a setting here"),
    ({"training": json.dumps({"compile": "yes"})}, "training.compile: expected bool or null"),
    ({"training": json.dumps({"gradAccum": 0})}, "training.gradAccum (--grad-accum) must be at least 1"),
    ({"training": json.dumps(["steps"])}, "training: expected an object"),
    ({"extraPip": json.dumps("datasets")}, "extraPip: expected a list of strings"),
    ({"training": json.dumps({"mlflowTrackingUri": "http://m:5000"})},
     "training.mlflowTrackingUri: not a setting here; set the stack key mlflowTrackingUri"),
    ({"mlflowTrackingUri": "mlflow.internal:5000"},
     "mlflowTrackingUri: must be a tracking server's http:// or https:// URL"),
    ({"training": json.dumps({"exportDtype": "fp16"})}, "training.exportDtype: expected 'bf16'"),
])
def test_typos_and_misplaced_settings_name_the_key_and_the_fix(raw, message):
    assert any(message in p for p in problems(raw)), problems(raw)


def test_numbers_set_with_pulumi_config_path_arrive_as_text_and_are_read_as_numbers():
    """`pulumi config set --path training.lr 0.0002` stores a string."""
    cfg = parse({"training": json.dumps({"lr": "0.0002", "memoryBudgetGib": "22.5"})}, "us-west-2")
    assert cfg.training.lr == 0.0002 and cfg.training.memory_budget_gib == 22.5


@pytest.mark.parametrize("project, stack, expected", [
    ("eks-ray-train", "dev", "eks-ray-train-dev"),
    ("eks-ray-train", "Prod_US.East", "eks-ray-train-prod-us-east"),
    ("eks-ray-train", "a-very-long-stack-name-for-testing", "eks-ray-train-a-very-long-stack-name"),
    ("eks-ray-train", "a" * 21 + "-b", "eks-ray-train-" + "a" * 21),  # no trailing '-'
    ("9", "Dev", "dev"),
])
def test_the_default_cluster_name_is_a_valid_one(project, stack, expected):
    from stack.pulumi_config import default_cluster_name

    name = default_cluster_name(project, stack)
    assert name == expected
    parse({}, "us-west-2", default_name=name)  # valid: no ConfigError


def test_job_settings_are_checked_with_the_runs_real_worker_count():
    """tokensPerStep must split evenly over the workers the stack runs (gpuNodeCount x GPUs),
    caught at `pulumi up`, not when the job starts on the GPU nodes."""
    assert parse({"gpuNodeCount": "2"}, "us-west-2").training.num_workers == 8
    found = problems({"gpuNodeCount": "3", "training": json.dumps({"tokensPerStep": 262144})})
    assert any(p.startswith("training.tokensPerStep") and "24576 " in p for p in found), found


@pytest.mark.parametrize("nodes, training, tokens", [
    ("2", {}, 16 * 2048 * 8),  # 262,144 on 2 x g6.12xlarge
    ("3", {}, 16 * 2048 * 12),  # scales with the run, so any node count is valid
    ("2", {"seqLen": 1024}, 16 * 1024 * 8),
    ("2", {"microBatchSize": 2}, None),  # a stack that sets its batch keeps it
    ("2", {"tokensPerStep": 65536}, 65536),
])
def test_the_default_batch_is_large_and_follows_the_run(nodes, training, tokens):
    cfg = parse({"gpuNodeCount": nodes, "training": json.dumps(training)}, "us-west-2")
    assert cfg.training.tokens_per_step == tokens and cfg.training.reduce_dtype == "bf16"


def test_a_stack_fine_tunes_a_real_instruction_set_unless_it_sets_data():
    """Never the pretrained checkpoint on random tokens by default, nor a toy set repeated: a
    public chat set from the Hub with its own test split, at a full fine-tuning learning rate;
    a stack's `epochs` replaces the default `steps`."""
    default = parse({}, "us-west-2").training
    assert default.data == "hf://trl-lib/Capybara" and default.lr <= 2e-5
    assert default.eval_data == "hf://trl-lib/Capybara:test" and default.eval_every > 0
    assert default.epochs is None and default.steps == 100
    by_epochs = parse({"training": json.dumps({"epochs": 2})}, "us-west-2").training
    assert (by_epochs.epochs, by_epochs.steps) == (2.0, TrainConfig().steps)
    with pytest.raises(ConfigError, match=r"training.steps \(--steps\) and --epochs both set"):
        parse({"training": json.dumps({"epochs": 2, "steps": 10})}, "us-west-2")
    # A stack's own data (here random tokens for a transport check) drops the default split.
    own = parse({"training": json.dumps({"data": "random"})}, "us-west-2").training
    assert (own.data, own.eval_data, own.eval_every) == ("random", None, 0)


def test_credentials_in_the_tracking_uri_are_refused_without_echoing_them():
    found = problems({"mlflowTrackingUri": "https://alice:s3cret@mlflow.example.com"})
    assert found and not any("s3cret" in p for p in found)
    cfg = parse({"mlflowTrackingUri": "https://mlflow.example.com",
                 "mlflowTrackingUsername": "alice", "mlflowTrackingPassword": "s3cret"},
                "us-west-2")
    assert cfg.mlflow_tracking_username == "alice" and cfg.mlflow_tracking_password_set
    assert "s3cret" not in repr(cfg)
