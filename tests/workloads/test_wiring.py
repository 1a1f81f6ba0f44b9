"""The Ray workloads as the Pulumi program declares them (under mocks): one RayJob per run with its
own cluster, no long-lived RayCluster, and a replaced job deleted before its successor starts."""

from __future__ import annotations

import pytest

from tests.conftest import KUBERAY_CRDS, need
from tests.infra.harness import run_program
from tests.stack.stacks import STACK_FILES, stack_name
from tests.workloads.crd_schema import load_schema, rayjob_rules, validate

DEV = next(p for p in STACK_FILES if stack_name(p) == "dev")
RAYJOB = "kubernetes:ray.io/v1:RayJob"


@pytest.fixture(scope="module")
def dev():
    return run_program(DEV)


def test_one_rayjob_brings_its_cluster_and_no_raycluster_stays(dev):
    assert not dev.of_type("kubernetes:ray.io/v1:RayCluster")
    spec = dev.one(RAYJOB).inputs["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and "clusterSelector" not in spec
    worker = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"] == 2
    assert spec["submitterConfig"]["backoffLimit"] >= 2
    assert spec["activeDeadlineSeconds"] > 0 and spec["preRunningDeadlineSeconds"] > 0


def test_every_emitted_ray_resource_validates_strictly(dev):
    """What the program sends, not only what the builder returns: every ray.io object against
    its CRD (unknown fields are errors) and KubeRay's own RayJob rules."""
    emitted = [r for r in dev.resources if r.type.startswith("kubernetes:ray.io/v1:")]
    assert [r.type for r in emitted] == [RAYJOB]
    for r in emitted:
        kind = r.type.rsplit(":", 1)[1]
        schema = load_schema(need(KUBERAY_CRDS / f"ray.io_{kind.lower()}s.yaml"))
        obj = as_json({"apiVersion": r.inputs["apiVersion"], "kind": kind,
                       "metadata": r.inputs["metadata"], "spec": r.inputs["spec"]})
        assert validate(obj, schema) == [] and rayjob_rules(obj) == []


def as_json(value):
    """Pulumi carries every number as a double (protobuf Struct); the provider's JSON writes a
    whole one as an integer (2.0 -> 2), which is what the API server validates."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def test_a_changed_job_replaces_the_old_one_after_deleting_it(dev):
    opts = dev.options["ray-rayjob"]
    assert opts["deleteBeforeReplace"] is True
    assert "spec" in opts["replaceOnChanges"]  # KubeRay ignores spec edits of a RayJob
    # The operator outlives the RayJob (its finalizer). The run's code ConfigMap comes after
    # it: its owner reference needs the uid the API server gave the RayJob.
    assert dev.depends_on("ray-rayjob", "addons-kuberay-operator")
    assert dev.depends_on("ray-code", "ray-rayjob")


def test_the_stacks_run_carries_its_code_in_a_configmap_its_rayjob_owns(dev):
    job = dev.one("kubernetes:ray.io/v1:RayJob", "ray-rayjob").inputs
    code = dev.one("kubernetes:core/v1:ConfigMap", "ray-code").inputs
    digest = job["metadata"]["annotations"]["eks-ray-train/code-digest"]
    assert code["metadata"]["name"] == f"{job['metadata']['name']}-code-{digest[:12]}"
    owner, = code["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("RayJob", job["metadata"]["name"])
    assert owner["uid"]  # the API server's, as the mock answers a create
    volume = job["spec"]["submitterPodTemplate"]["spec"]["volumes"][0]["configMap"]
    assert volume["name"] == code["metadata"]["name"]
    assert {i["key"] for i in volume["items"]} == set(code["data"])


def test_the_rayjob_starts_after_the_pod_identity_of_its_service_account(dev):
    """Its pods get S3 credentials only if the association exists when they are created. The
    edge must be the RayJob's own registered dependency: a component's `depends_on` does not
    reach its children (the mock follows registered dependencies only, as the engine does)."""
    assoc = dev.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "ckpt")
    assert dev.depends_on("ray-rayjob", assoc.name)


def test_outputs_name_the_job_and_its_dashboard_service(dev):
    job = dev.exports["rayJob"]
    assert job == dev.one(RAYJOB).inputs["metadata"]["name"]
    assert dev.exports["rayHeadService"] == f"{job}-head-svc"
    assert "rayCluster" not in dev.exports


@pytest.mark.parametrize("overrides", [{"runJob": "false"}, {"gpuNodeCount": "0"}],
                         ids=["runJob-false", "zero-gpu-nodes"])
def test_no_job_without_a_run(overrides):
    """No RayJob when runs are switched off, or when no GPU node may start (it could only wait
    for its preRunningDeadlineSeconds and fail)."""
    m = run_program(DEV, overrides)
    assert not m.of_type(RAYJOB) and not m.of_type("kubernetes:ray.io/v1:RayCluster")
    assert m.exports["rayJob"] is None and m.exports["rayHeadService"] is None
    # No code ConfigMap either (each run carries its own); the rest of the workloads stays,
    # the head's Roles included: a submitted run needs them.
    assert not m.of_type("kubernetes:core/v1:ConfigMap")
    assert m.of_type("kubernetes:core/v1:ServiceAccount")
    assert m.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")


def test_the_heads_roles_name_this_runs_rayjob_and_come_before_it(dev):
    job = dev.one(RAYJOB)
    role = next(r for r in dev.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
                if r.inputs["metadata"]["namespace"] == "ray")
    rayjob_rule = next(r for r in role.inputs["rules"] if r["resources"] == ["rayjobs"])
    assert rayjob_rule["resourceNames"] == [job.inputs["metadata"]["name"]]
    rbac = [r for r in dev.resources if r.type.startswith("kubernetes:rbac.authorization.k8s.io")]
    assert len(rbac) == 6
    assert {r.name for r in rbac} <= dev.depends["ray-rayjob"]  # the head reads from its start
