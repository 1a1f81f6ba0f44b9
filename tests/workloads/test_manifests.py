"""The RayJob builder (with its per-run cluster): strict CRD validation for every stack, KubeRay's
own rules, and the manifests' semantics."""

from __future__ import annotations

import copy
import dataclasses
import json
import shlex

import pytest
import yaml

from stack.parse import parse
from stack.kube import CODE_DIGEST_ANNOTATION, RAYCLUSTER_NAME_MAX, RAYJOB_NAME_MAX
from tests.conftest import KUBERAY_CRDS, REPO, need
from tests.stack.stacks import STACK_FILES, raw_config, stack_name
from tests.workloads.crd_schema import load_schema, rayjob_rules, validate
from training.pod_contract import CODE_DIGEST_ENV
from workloads.code_bundle import CodeBundleError, bundle
from workloads.raycluster import build_cluster_spec
from workloads.rayjob import build_rayjob, head_service, job_hash

S3 = "s3://ckpt-bucket/runs"


@pytest.fixture(scope="module")
def schema():
    return load_schema(need(KUBERAY_CRDS / "ray.io_rayjobs.yaml"))


@pytest.fixture(scope="module")
def code():
    return bundle(REPO)


def stack(path=STACK_FILES[0], **overrides):
    raw, region = raw_config(path)
    raw.update(overrides)
    return parse(raw, region)


@pytest.mark.parametrize("path", STACK_FILES, ids=stack_name)
@pytest.mark.parametrize("overrides", [{}, {"gpuNodeCount": "1"}, {"strictEfa": "true"}],
                         ids=["as-committed", "one-node", "strict"])
def test_every_rayjob_of_every_stack_validates_strictly(schema, code, path, overrides):
    """The RayJob with its nested rayClusterSpec: the CRD schema and KubeRay's own rules."""
    job = build_rayjob(stack(path, **overrides), code, S3)
    assert validate(job, schema) == []
    assert rayjob_rules(job) == []


def test_validator_rejects_a_typo_a_wrong_type_and_a_value_below_minimum(schema, code):
    job = build_rayjob(stack(), code, S3)
    typo = copy.deepcopy(job)
    typo["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 2
    assert any("replica: unknown field" in e for e in validate(typo, schema))
    wrong = copy.deepcopy(job)
    wrong["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "2"
    assert any("replicas: expected integer" in e for e in validate(wrong, schema))
    deep = copy.deepcopy(job)
    cluster_spec(deep)["headGroupSpec"]["template"]["spec"]["containers"][0][
        "imagePullPolcy"] = "Always"
    assert validate(deep, schema)
    meta = copy.deepcopy(job)
    meta["metadata"]["nmae"] = "x"
    assert validate(meta, schema)
    low = copy.deepcopy(job)
    low["spec"]["preRunningDeadlineSeconds"] = 0
    assert any("below the minimum 1" in e for e in validate(low, schema))


def test_kuberay_rules_reject_what_the_operator_would_fail(code):
    job = build_rayjob(stack(), code, S3)
    rules = copy.deepcopy(job)
    rules["spec"]["deletionStrategy"] = {"deletionRules": [{"policy": "DeleteCluster"}]}
    assert any("exclusive" in e for e in rayjob_rules(rules))
    selector = copy.deepcopy(job)
    del selector["spec"]["rayClusterSpec"]
    assert any("rayClusterSpec or clusterSelector" in e for e in rayjob_rules(selector))
    selector["spec"].update(clusterSelector={"ray.io/cluster": "x"}, backoffLimit=1)
    assert any("backoffLimit" in e for e in rayjob_rules(selector))
    keep = copy.deepcopy(job)
    keep["spec"].update(shutdownAfterJobFinishes=False, ttlSecondsAfterFinished=60)
    assert any("ttlSecondsAfterFinished" in e for e in rayjob_rules(keep))


def cluster_spec(job: dict) -> dict:
    return job["spec"]["rayClusterSpec"]


def containers(spec: dict, group: str) -> dict:
    g = spec["headGroupSpec"] if group == "head" else spec["workerGroupSpecs"][0]
    return g["template"]["spec"]["containers"][0]


def env(container: dict) -> dict:
    return {e["name"]: e.get("value") for e in container["env"]}


def test_head_has_no_gpus_and_void_devices_on_the_system_node():
    spec = build_cluster_spec(stack())
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0" and head["rayStartParams"]["num-gpus"] == "0"
    assert all(isinstance(v, str) for v in head["rayStartParams"].values())
    c = containers(spec, "head")
    assert env(c)["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert c["resources"]["requests"] == c["resources"]["limits"]
    assert head["template"]["spec"]["nodeSelector"] == {"role": "system"}
    assert head["serviceType"] == "ClusterIP"  # dashboard by port-forward only


@pytest.mark.parametrize("gpu_type, gpus, efa", [("g6.12xlarge", 4, 1), ("g6e.12xlarge", 4, 1),
                                                 ("p5.48xlarge", 8, 32)])
def test_gpu_family_switch_is_config_only(schema, code, gpu_type, gpus, efa):
    cfg = stack(gpuInstanceType=gpu_type)
    job = build_rayjob(cfg, code, S3)
    spec = cluster_spec(job)
    worker = spec["workerGroupSpecs"][0]
    c = containers(spec, "worker")
    limits = c["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == str(gpus) == worker["rayStartParams"]["num-gpus"]
    assert limits["vpc.amazonaws.com/efa"] == str(efa)
    assert int(limits["cpu"]) < cfg.gpu.vcpus and int(limits["memory"][:-2]) < cfg.gpu.memory_gib
    assert c["resources"]["requests"] == limits
    assert f"--num-workers {cfg.gpu_node_count * gpus}" in job["spec"]["entrypoint"]
    assert validate(job, schema) == []


@pytest.mark.parametrize("nodes", ["1", "2", "4"])
def test_the_run_gets_exactly_one_worker_pod_per_gpu_node(nodes):
    """replicas = min = max: KubeRay submits only once every worker runs (the cluster is Ready
    when all its pods run), and Ray's autoscaler has nothing to add or remove."""
    worker = build_cluster_spec(stack(gpuNodeCount=nodes))["workerGroupSpecs"][0]
    assert worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"] == int(nodes)
    assert "enableInTreeAutoscaling" not in build_cluster_spec(stack())


def test_worker_env_volumes_and_lifecycle():
    spec = build_cluster_spec(stack())
    worker = spec["workerGroupSpecs"][0]["template"]["spec"]
    c = worker["containers"][0]
    e = env(c)
    assert e["FI_PROVIDER"] == "efa" and e["NCCL_SOCKET_IFNAME"] == "eth0"
    assert e["NCCL_DEBUG"] == "INFO" and "NCCL_NET_PLUGIN" in e and "NCCL_NET" not in e
    assert "FI_EFA_USE_DEVICE_RDMA" not in e  # not on g6: L4 has no GPUDirect RDMA
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in worker[
        "tolerations"]
    assert worker["nodeSelector"] == {"role": "gpu-worker"}
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/dev/shm", "/tmp/ray"} <= mounts
    assert "lifecycle" not in c  # SIGTERM drains (tests/workloads/test_preemptible_pods.py)
    assert spec["rayVersion"] == "2.58.0"
    head_image = containers(spec, "head")["image"]
    assert head_image == c["image"] == stack().image


def test_strict_efa_uses_the_plugins_own_name():
    """aws-ofi-nccl >= 1.13 names itself `Libfabric` (src/nccl_ofi_interface_nvidia.c); the image
    ships 1.20, where "AWS Libfabric" only works through a compatibility constructor."""
    worker = containers(build_cluster_spec(stack(strictEfa="true")), "worker")
    assert env(worker)["NCCL_NET"] == "Libfabric"


def test_names_within_limits_for_the_longest_allowed_cluster_name(code):
    cfg = stack(clusterName="a" * (RAYJOB_NAME_MAX - 11))
    name = build_rayjob(cfg, code, S3)["metadata"]["name"]
    assert len(name) == RAYJOB_NAME_MAX
    # KubeRay names the run's cluster `<rayjob>-<5 random>` (utils.GenerateRayClusterName).
    assert len(name) + 6 <= RAYCLUSTER_NAME_MAX
    assert head_service(name) == f"{name}-head-svc"


def test_job_brings_its_own_cluster_and_ends_it(code):
    cfg = stack()
    job = build_rayjob(cfg, code, S3)["spec"]
    assert "clusterSelector" not in job and "deletionStrategy" not in job
    assert job["shutdownAfterJobFinishes"] is True
    assert job["ttlSecondsAfterFinished"] == 0  # queued: the next run's head needs the room
    unqueued = build_rayjob(stack(queue="false"), code, S3)["spec"]
    assert 60 <= unqueued["ttlSecondsAfterFinished"] <= 900  # minutes to read logs
    assert job["activeDeadlineSeconds"] == cfg.job_deadline_seconds
    # Scale-from-zero: node boot plus a large image pull fit before the submission deadline.
    assert job["preRunningDeadlineSeconds"] >= 20 * 60
    assert job["submitterConfig"]["backoffLimit"] >= 2  # KubeRay's retry, idempotent submit
    assert job.get("backoffLimit", 0) == 0  # a whole new cluster per retry: not by default
    submitter = job["submitterPodTemplate"]["spec"]
    assert submitter["nodeSelector"] == {"role": "system"}


def test_job_code_is_the_working_dir_and_flags_are_the_clis(code):
    cfg = stack()
    job = build_rayjob(cfg, code, S3)["spec"]
    runtime_env = yaml.safe_load(job["runtimeEnvYAML"])
    mount = job["submitterPodTemplate"]["spec"]["containers"][0]["volumeMounts"][0]["mountPath"]
    # The driver reads the run's code digest from its environment for the summary.
    assert runtime_env == {"working_dir": mount, "env_vars": {CODE_DIGEST_ENV: code.digest}}
    assert code.digest == build_rayjob(cfg, code, S3)["metadata"]["annotations"][
        CODE_DIGEST_ANNOTATION]
    from training.driver.cli import build_parser

    args = shlex.split(job["entrypoint"])
    assert args[:3] == ["python", "-m", "training"]
    flags = build_parser().parse_args(args[3:])
    assert flags.model == "Qwen/Qwen2.5-1.5B" and flags.storage_path == S3
    assert flags.expect_transport == "efa" and flags.address == "auto" and flags.use_gpu
    assert flags.num_workers == 8


def test_extra_pip_packages_go_through_runtime_env(code):
    cfg = stack(extraPip=json.dumps(["datasets==4.4.1"]))
    env = yaml.safe_load(build_rayjob(cfg, code, S3)["spec"]["runtimeEnvYAML"])
    assert env["pip"] == ["datasets==4.4.1"]


def test_job_hash_changes_with_code_and_settings_and_nothing_else(code, tmp_path):
    cfg = stack()
    base = job_hash(code, cfg, S3)
    assert job_hash(bundle(REPO), stack(), S3) == base  # same inputs, same name: no-op update
    assert job_hash(code, stack(gpuNodeCount="0"), S3) != base  # different world size
    assert job_hash(code, stack(training=json.dumps({"steps": 101})), S3) != base
    assert job_hash(code, stack(tags='{"team": "other"}'), S3) == base  # not a job setting
    changed = dataclasses.replace(code, digest=code.digest[::-1])
    assert job_hash(changed, cfg, S3) != base


def test_configmap_holds_exactly_the_files_of_training(code):
    files = {p.relative_to(REPO).as_posix(): p.read_text()
             for p in (REPO / "training").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts}
    shipped = {item["path"]: code.data[item["key"]] for item in code.items}
    assert shipped == files
    assert all(len(k) <= 253 and all(c.isalnum() or c in "-._" for c in k) for k in code.data)


def test_code_over_the_configmap_limit_is_refused_clearly(tmp_path):
    pkg = tmp_path / "training"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "big.jsonl").write_text("x" * 2_000_000)
    with pytest.raises(CodeBundleError, match="over the 1,048,576-byte ConfigMap limit"):
        bundle(tmp_path)


def test_editing_the_benchmark_leaves_the_rayjob_name_unchanged(code, tmp_path):
    import shutil

    for package in ("training", "bench"):
        shutil.copytree(REPO / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__", "runs"))
    (tmp_path / "bench/benchmark.py").write_text("# a comment\n" + (
        tmp_path / "bench/benchmark.py").read_text())
    cfg = stack()
    assert build_rayjob(cfg, bundle(tmp_path), S3)["metadata"]["name"] == \
        build_rayjob(cfg, code, S3)["metadata"]["name"]
    (tmp_path / "training/run/loop.py").write_text("# a comment\n" + (
        tmp_path / "training/run/loop.py").read_text())
    assert build_rayjob(cfg, bundle(tmp_path), S3)["metadata"]["name"] != \
        build_rayjob(cfg, code, S3)["metadata"]["name"]


def _non_default(f, hint):
    """A valid value for TrainConfig field `f` that differs from its default."""
    import typing

    # Batch settings must fit the others (seq 128 + 3 below; a worker count dividing 8; the
    # non-default objective, DPO, steps in pair rows of 2 x seq).
    valid = {"tokens_per_step": 131 * 8 * 2 * 2, "hsdp_replicas": 2, "eval_fraction": 0.1,
             "accum_dtype": "fp32", "lora_dropout": 0.05, "lora_target_modules": "q_proj,v_proj"}
    if f.name in valid:
        return valid[f.name]
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Literal:
        return next(a for a in args if a != f.default)
    kinds = set(args) or {hint}
    if bool in kinds:
        return not f.default
    if int in kinds:
        return (f.default or 0) + 3
    if float in kinds:
        return (f.default or 1.0) * 2 + 0.5
    return f"custom-{f.name}"


def test_every_job_setting_is_reachable_from_a_stack_and_reaches_the_entrypoint(code):
    """The stack's `training` object is the job's flags in camelCase: set every one of them to a
    non-default value, and the entrypoint parses back to exactly those values."""
    from stack.parse import SET_BY_THE_STACK
    from training.driver.cli import parse as parse_flags
    from training.options import options
    from training.settings import setting_key

    # --load-in-4bit exists to be refused with the reason (QLoRA is not supported).
    wanted = {o.name: _non_default(o.field, o.hint) for o in options()
              if o.name not in {*SET_BY_THE_STACK, "load_in_4bit"}}
    # One evaluation set at a time: --eval-data takes the place of --eval-fraction; and
    # --epochs the place of --steps.
    exclusive = {"eval_fraction": wanted.pop("eval_fraction"), "epochs": wanted.pop("epochs")}
    others = {k: v for k, v in wanted.items() if k not in ("eval_data", "steps")}
    for settings in (wanted, {**others, **exclusive}):
        cfg = stack(training=json.dumps({setting_key(k): v for k, v in settings.items()}))
        args = shlex.split(build_rayjob(cfg, code, S3)["spec"]["entrypoint"])
        job = parse_flags(args[3:])
        assert {o.name: o.value(job) for o in options() if o.name in settings} == settings
        assert job.num_workers == cfg.num_workers and job.storage_path == S3 and job.use_gpu


def test_job_defaults_on_the_cluster_recover_from_a_lost_worker(code):
    from training.driver.cli import parse as parse_flags

    job = parse_flags(shlex.split(build_rayjob(stack(), code, S3)["spec"]["entrypoint"])[3:])
    assert job.max_failures == 2 and job.model == "Qwen/Qwen2.5-1.5B"


def test_pods_follow_the_node_selectors_of_an_existing_cluster(code):
    cfg = stack(existingClusterName="shared-gpu", systemNodeSelector='{"pool": "cpu"}',
                gpuNodeSelector='{"pool": "l4"}')
    spec = build_rayjob(cfg, code, S3)["spec"]
    cluster = spec["rayClusterSpec"]
    assert cluster["headGroupSpec"]["template"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert cluster["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] == {"pool": "l4"}
    assert spec["submitterPodTemplate"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    own = build_rayjob(stack(), code, S3)["spec"]["rayClusterSpec"]
    assert own["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"] == {"role": "gpu-worker"}


def test_the_stack_sets_every_setting_it_keeps_from_the_training_object(code):
    """Each field of SET_BY_THE_STACK is refused in `training`; job_settings must set it, or
    that setting would be out of reach."""
    import dataclasses as dc

    from stack.parse import SET_BY_THE_STACK
    from training.config import TrainConfig
    from workloads.rayjob import job_settings

    # The dev stack (two nodes, so EFA is expected) with tracking and strict EFA on.
    job = job_settings(stack(mlflowTrackingUri="http://mlflow.internal:5000", strictEfa="true"),
                       S3)
    defaults = TrainConfig()
    assert {f: getattr(job, f) for f in SET_BY_THE_STACK
            if getattr(job, f) == getattr(defaults, f)} == {}
    assert set(SET_BY_THE_STACK) <= {f.name for f in dc.fields(TrainConfig)}


def test_mlflow_tracking_installs_the_pinned_client_and_the_job_gets_the_uri(code):
    from stack.catalog import MLFLOW_CLIENT

    off = yaml.safe_load(build_rayjob(stack(), code, S3)["spec"]["runtimeEnvYAML"])
    assert "pip" not in off  # no tracking: nothing installed, nothing imported
    cfg = stack(mlflowTrackingUri="http://mlflow.internal:5000", extraPip='["datasets==4.4.1"]')
    job = build_rayjob(cfg, code, S3)["spec"]
    assert yaml.safe_load(job["runtimeEnvYAML"])["pip"] == ["datasets==4.4.1", MLFLOW_CLIENT]
    from training.driver.cli import build_parser

    flags = build_parser().parse_args(shlex.split(job["entrypoint"])[3:])
    assert flags.mlflow_tracking_uri == "http://mlflow.internal:5000"
    assert flags.export  # the cluster exports the fine-tuned model by default (JOB_DEFAULTS)
    # The tests' MLflow is the client the cluster installs.
    assert MLFLOW_CLIENT in (REPO / "requirements-dev.txt").read_text().splitlines()


def test_tracking_credentials_reach_every_ray_pod_from_the_secret_only(schema, code):
    """mlflow reads MLFLOW_TRACKING_USERNAME / _PASSWORD itself (mlflow/environment_variables.py);
    the RayJob names the Secret, never the values."""
    from stack.kube import MLFLOW_SECRET

    cfg = stack(mlflowTrackingUri="https://mlflow.example.com", mlflowTrackingUsername="alice",
                mlflowTrackingPassword="s3cret")
    job = build_rayjob(cfg, code, S3)
    assert validate(job, schema) == [] and rayjob_rules(job) == []
    assert "s3cret" not in json.dumps(job) and "alice" not in json.dumps(job)
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for pod in pods:
        env = {e["name"]: e for e in pod["template"]["spec"]["containers"][0]["env"]}
        for var, key in (("MLFLOW_TRACKING_USERNAME", "username"),
                         ("MLFLOW_TRACKING_PASSWORD", "password")):
            assert env[var] == {"name": var, "valueFrom": {"secretKeyRef": {
                "name": MLFLOW_SECRET, "key": key}}}
    plain = build_cluster_spec(stack(mlflowTrackingUri="https://mlflow.example.com"))
    assert not [e for e in plain["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
                if e["name"].startswith("MLFLOW_TRACKING_")]
